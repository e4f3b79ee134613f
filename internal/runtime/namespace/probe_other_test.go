//go:build !amd64

package namespace

// syscallAttacks has amd64's syscall numbers only; elsewhere the in-sandbox
// attack test skips (TestSeccompPolicy still checks the compiled filter).
func syscallAttacks() []syscallAttack { return nil }
