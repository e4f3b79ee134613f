// Package secrets encrypts small secrets (registry passwords, later proxy
// credentials) at rest with AES-256-GCM under one key per install.
//
// The key is 32 random bytes generated on first use into a file (by
// convention <data-dir>/secrets.key, mode 0600) and never leaves the daemon.
// Each sealed value carries its own random nonce and is bound to an
// "associated data" string (e.g. the record id), so a ciphertext copied into
// another record does not decrypt.
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/cubicle-dev/cubicle/internal/atomicfile"
	"io/fs"
	"os"
)

// KeySize is the length of the key file in bytes (AES-256).
const KeySize = 32

// version prefixes every sealed value, so the format can change later.
const version byte = 1

// Box seals and opens secrets with one key. Safe for concurrent use.
type Box struct {
	aead cipher.AEAD
}

// LoadOrCreate returns a Box over the key in path, creating the file with a
// fresh random key (mode 0600) if it does not exist. A key file of the
// wrong size or with group/other permissions is refused rather than used.
func LoadOrCreate(path string) (*Box, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, err = create(path)
	}
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("secrets: stat key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secrets: key file %s is accessible by group or others (mode %v); chmod 600 it", path, st.Mode().Perm())
	}
	return New(key)
}

// create writes a new random key to path unless another process created
// one first, whose key it then reads. The file appears whole, so neither a
// crash nor a racing reader ever sees a short key.
func create(path string) ([]byte, error) {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("secrets: generate key: %w", err)
	}
	created, err := atomicfile.Create(path, key, 0o600)
	if err != nil {
		return nil, fmt.Errorf("secrets: create key: %w", err)
	}
	if !created {
		return os.ReadFile(path)
	}
	return key, nil
}

// New returns a Box over a KeySize-byte key.
func New(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secrets: key is %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	return &Box{aead: aead}, nil
}

// Seal encrypts plaintext bound to ad: version || nonce || ciphertext+tag.
func (b *Box) Seal(plaintext []byte, ad string) ([]byte, error) {
	out := make([]byte, 1+b.aead.NonceSize(), 1+b.aead.NonceSize()+len(plaintext)+b.aead.Overhead())
	out[0] = version
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("secrets: nonce: %w", err)
	}
	return b.aead.Seal(out, out[1:], plaintext, []byte(ad)), nil
}

// ErrCorrupt is returned by Open for a value that was not sealed by this
// key with this associated data, or was altered.
var ErrCorrupt = errors.New("secrets: cannot decrypt (wrong key, wrong record, or corrupted)")

// Open decrypts a value made by Seal with the same ad.
func (b *Box) Open(sealed []byte, ad string) ([]byte, error) {
	n := b.aead.NonceSize()
	if len(sealed) < 1+n+b.aead.Overhead() || sealed[0] != version {
		return nil, ErrCorrupt
	}
	pt, err := b.aead.Open(nil, sealed[1:1+n], sealed[1+n:], []byte(ad))
	if err != nil {
		return nil, ErrCorrupt
	}
	return pt, nil
}
