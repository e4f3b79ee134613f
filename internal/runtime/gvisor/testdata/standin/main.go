// Command standin is a tiny stand-in for the cubicle agent used by the
// gvisor driver's own tests: run as PID 1 with the argument "agent", it
// serves HTTP on $STANDIN_PORT (default 8080):
//
//	GET /hostname          the UTS hostname
//	GET /write?path=&data= writes data to path
//	GET /sh?c=             runs /bin/sh -c c, returns combined output
//
// With the argument "hog N" it allocates and touches N MiB, prints "held",
// then sleeps (a memory hog for limit tests).
//
// Like the agent, it honours CUBICLE_AGENT_OWN_CAPS (agent.OwnCapsEnv):
// the driver gives PID 1 CAP_SYS_ADMIN for itself, and a PID 1 that kept
// it in its commands' bounding set would lift RLIMIT_NPROC off them.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "hog" {
		hog(os.Args[2])
		return
	}
	if os.Getenv("CUBICLE_AGENT_OWN_CAPS") == "CAP_SYS_ADMIN" {
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); e != 0 {
			fmt.Fprintln(os.Stderr, "standin: drop CAP_SYS_ADMIN:", e)
			os.Exit(1)
		}
	}
	port := os.Getenv("STANDIN_PORT")
	if port == "" {
		port = "8080"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hostname", func(w http.ResponseWriter, r *http.Request) {
		h, _ := os.Hostname()
		fmt.Fprint(w, h)
	})
	mux.HandleFunc("/write", func(w http.ResponseWriter, r *http.Request) {
		if err := os.WriteFile(r.URL.Query().Get("path"), []byte(r.URL.Query().Get("data")), 0o644); err != nil {
			http.Error(w, err.Error(), 500)
		}
	})
	mux.HandleFunc("/sh", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "/bin/sh", "-c", r.URL.Query().Get("c")).CombinedOutput()
		if err != nil {
			w.Header().Set("X-Exit", err.Error())
		}
		w.Write(out)
	})
	if err := http.ListenAndServe(":"+port, mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func hog(mib string) {
	n, err := strconv.Atoi(mib)
	if err != nil {
		os.Exit(2)
	}
	var keep [][]byte
	for i := 0; i < n; i++ {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		keep = append(keep, b)
	}
	fmt.Println("held", len(keep))
	time.Sleep(time.Hour)
}
