package userns

import (
	"fmt"
	"testing"
)

func TestParseOverlayOpts(t *testing.T) {
	l, err := parseOverlayOpts(`rw,lowerdir=/a\:b:/c\054d,upperdir=/u\040x,workdir=/w,redirect_dir=on`)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(l.lower) != "[/a:b /c,d]" || l.upper != "/u x" || l.work != "/w" {
		t.Fatalf("got %+v", l)
	}
	l, err = parseOverlayOpts(`ro,lowerdir+=/a,lowerdir+=/b,upperdir=/u,workdir=/w`)
	if err != nil || fmt.Sprint(l.lower) != "[/a /b]" {
		t.Fatalf("got %+v, %v", l, err)
	}
}
