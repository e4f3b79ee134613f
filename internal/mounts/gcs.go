package mounts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
)

// gcsBackend is a GCS bucket through the JSON API, authorised with OAuth
// tokens minted from the mount's service-account key.
type gcsBackend struct {
	hc       *http.Client
	endpoint string // https://storage.googleapis.com
	bucket   string
	prefix   string
}

var _ Backend = (*gcsBackend)(nil)

const gcsScope = "https://www.googleapis.com/auth/devstorage.read_write"

func newGCSBackend(ctx context.Context, cfg *GCS, key []byte, endpoint string, hc *http.Client) (*gcsBackend, error) {
	jwt, err := google.JWTConfigFromJSON(key, gcsScope)
	if err != nil {
		return nil, fmt.Errorf("service_account_json: not a service-account key file")
	}
	if endpoint == "" {
		endpoint = "https://storage.googleapis.com"
	}
	// Tokens are minted through the same client (its CA roots and dial
	// policy), and outlive the boot's context.
	tctx := context.WithValue(context.WithoutCancel(ctx), oauth2.HTTPClient, hc)
	client := &http.Client{Transport: &oauth2.Transport{Source: oauth2.ReuseTokenSource(nil, jwt.TokenSource(tctx)), Base: hc.Transport}}
	return &gcsBackend{hc: client, endpoint: strings.TrimRight(endpoint, "/"), bucket: cfg.Bucket, prefix: cfg.Prefix}, nil
}

type gcsObject struct {
	Name    string    `json:"name"`
	Size    string    `json:"size"`
	Updated time.Time `json:"updated"`
	ETag    string    `json:"etag"`
}

func (b *gcsBackend) object(o gcsObject) Object {
	n, _ := strconv.ParseInt(o.Size, 10, 64)
	return Object{Key: strings.TrimPrefix(o.Name, b.prefix), Size: n, ModTime: o.Updated, ETag: o.ETag}
}

func (b *gcsBackend) objURL(key string) string {
	return b.endpoint + "/storage/v1/b/" + url.PathEscape(b.bucket) + "/o/" + url.PathEscape(b.prefix+key)
}

// do sends a request and maps a failed status to the store's error kinds.
func (b *gcsBackend) do(ctx context.Context, op, method, u string, body io.Reader, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return b.send(op, req)
}

// send sends req and maps a failure status to the mounts' errors.
func (b *gcsBackend) send(op string, req *http.Request) (*http.Response, error) {
	resp, err := b.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gcs %s: %w", op, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil, fmt.Errorf("gcs %s: %w", op, errNotFound)
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, fmt.Errorf("gcs %s: %w: %s", op, errDenied, bytes.TrimSpace(msg))
	}
	return nil, fmt.Errorf("gcs %s: %s: %s", op, resp.Status, bytes.TrimSpace(msg))
}

func (b *gcsBackend) list(ctx context.Context, prefix, delim string) ([]Object, []string, error) {
	var objs []Object
	var dirs []string
	token := ""
	for {
		q := url.Values{"prefix": {b.prefix + prefix}}
		if delim != "" {
			q.Set("delimiter", delim)
		}
		if token != "" {
			q.Set("pageToken", token)
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		resp, err := b.do(cctx, "list "+prefix, http.MethodGet, b.endpoint+"/storage/v1/b/"+url.PathEscape(b.bucket)+"/o?"+q.Encode(), nil, nil)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		var page struct {
			Items         []gcsObject `json:"items"`
			Prefixes      []string    `json:"prefixes"`
			NextPageToken string      `json:"nextPageToken"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		cancel()
		if err != nil {
			return nil, nil, fmt.Errorf("gcs list %s: %w", prefix, err)
		}
		for _, o := range page.Items {
			objs = append(objs, b.object(o))
		}
		for _, p := range page.Prefixes {
			dirs = append(dirs, strings.TrimPrefix(p, b.prefix))
		}
		if token = page.NextPageToken; token == "" {
			return objs, dirs, nil
		}
	}
}

func (b *gcsBackend) List(ctx context.Context, prefix string) ([]Object, []string, error) {
	return b.list(ctx, prefix, "/")
}

func (b *gcsBackend) ListAll(ctx context.Context, prefix string) ([]Object, error) {
	objs, _, err := b.list(ctx, prefix, "")
	return objs, err
}

func (b *gcsBackend) Stat(ctx context.Context, key string) (Object, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := b.do(ctx, "stat "+key, http.MethodGet, b.objURL(key), nil, nil)
	if err != nil {
		return Object{}, err
	}
	defer resp.Body.Close()
	var o gcsObject
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return Object{}, fmt.Errorf("gcs stat %s: %w", key, err)
	}
	return b.object(o), nil
}

func (b *gcsBackend) Get(ctx context.Context, key string, off int64, w io.Writer) error {
	ctx, p := withProgress(ctx)
	defer p.done()
	hdr := http.Header{}
	if off > 0 {
		hdr.Set("Range", fmt.Sprintf("bytes=%d-", off))
	}
	resp, err := b.do(ctx, "get "+key, http.MethodGet, b.objURL(key)+"?alt=media", nil, hdr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(progressWriter{w, p}, resp.Body); err != nil {
		return fmt.Errorf("gcs get %s: %w", key, err)
	}
	return nil
}

func (b *gcsBackend) Put(ctx context.Context, key string, r io.ReaderAt, size int64) error {
	ctx, p := withProgress(ctx)
	defer p.done()
	u := b.endpoint + "/upload/storage/v1/b/" + url.PathEscape(b.bucket) + "/o?" + url.Values{"uploadType": {"media"}, "name": {b.prefix + key}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, progressReader{io.NewSectionReader(r, 0, size), p})
	if err != nil {
		return err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := b.send("put "+key, req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (b *gcsBackend) Copy(ctx context.Context, src, dst string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*callTimeout)
	defer cancel()
	u := b.objURL(src) + "/copyTo/b/" + url.PathEscape(b.bucket) + "/o/" + url.PathEscape(b.prefix+dst)
	resp, err := b.do(ctx, "copy "+src+" to "+dst, http.MethodPost, u, nil, nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (b *gcsBackend) Delete(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := b.do(ctx, "delete "+key, http.MethodDelete, b.objURL(key), nil, nil)
	if err != nil {
		if errors.Is(err, errNotFound) {
			return nil
		}
		return err
	}
	resp.Body.Close()
	return nil
}
