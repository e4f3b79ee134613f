package api

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestWriteJSONString: the piecewise encoding equals json.Marshal, with
// runes, invalid bytes and escapes across the 64 KiB piece boundaries.
func TestWriteJSONString(t *testing.T) {
	for _, s := range []string{
		"", "hi\n", strings.Repeat("é", 100000), strings.Repeat("a", 64<<10-1) + "€" + strings.Repeat("\x00", 70000),
		strings.Repeat("\xff\x80", 50000) + "<&>" + strings.Repeat("😀", 40000),
	} {
		var got bytes.Buffer
		writeJSONString(&got, s)
		want, _ := json.Marshal(s)
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("string of %d bytes: encodings differ", len(s))
		}
	}
}

// TestCappedOutput: output past the cap is counted, not kept, and a rune
// cut by the cap is dropped.
func TestCappedOutput(t *testing.T) {
	c := &cappedOutput{max: 10}
	c.Write([]byte("12345678"))
	c.Write([]byte("é€")) // 2+3 bytes: the cap cuts the € after 0 bytes
	c.Write([]byte(strings.Repeat("x", 1000)))
	if got := c.String(); got != "12345678é" || !c.truncated() || c.total != 1013 {
		t.Fatalf("kept %q truncated %v total %d", got, c.truncated(), c.total)
	}
	c = &cappedOutput{max: 10}
	c.Write([]byte("123456789€")) // the cap keeps one byte of the €
	if got := c.String(); got != "123456789" || !c.truncated() || c.total != 12 {
		t.Fatalf("kept %q truncated %v total %d", got, c.truncated(), c.total)
	}
	whole := &cappedOutput{max: 10}
	whole.Write([]byte("abc"))
	if whole.String() != "abc" || whole.truncated() {
		t.Fatalf("small output: %q %v", whole.String(), whole.truncated())
	}
}

// TestWriteExecuteResult: the streamed answer decodes to the result.
func TestWriteExecuteResult(t *testing.T) {
	res := protocol.ExecuteResult{Stdout: strings.Repeat("o\x01", 100000), Stderr: "e", ExitCode: 7, StdoutTruncated: true, StdoutBytes: 1 << 30}
	rec := httptest.NewRecorder()
	writeExecuteResult(rec, res)
	var got protocol.ExecuteResult
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got != res || !utf8.Valid(rec.Body.Bytes()) {
		t.Fatalf("decoded %+v, %v", got.ExitCode, err)
	}
}
