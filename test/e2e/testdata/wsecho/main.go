// Command wsecho is a WebSocket echo server the gateway e2e test runs inside
// a sandbox (busybox has none). It is built static by the test and uploaded.
//
//	wsecho ADDR
package main

import (
	"log"
	"net/http"
	"os"

	"github.com/coder/websocket"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: wsecho ADDR")
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		for {
			typ, data, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, data); err != nil {
				return
			}
		}
	})
	log.Fatal(http.ListenAndServe(os.Args[1], h))
}
