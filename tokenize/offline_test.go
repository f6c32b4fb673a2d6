package tokenize

import (
	"net"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
)

// TestPkoukkNeverDownloads builds the pkoukk encoders in a fresh process whose HTTP proxy is a
// loopback listener of ours and whose tiktoken cache is empty: pkoukk's default loader would
// fetch the vocabulary through that proxy, so any connection to it means the offline loader was
// not in place. The listener answers nothing, so nothing leaves the machine either way.
func TestPkoukkNeverDownloads(t *testing.T) {
	if os.Getenv("KVGATE_TOKENIZE_OFFLINE_CHILD") == "1" {
		for _, encoding := range []string{EncodingCl100k, EncodingO200k} {
			enc := mustEncoder(t, LibraryPkoukk, encoding)
			if n, _ := enc.Count("hello world", -1); n != 2 {
				t.Fatalf("%s counted %d tokens in \"hello world\"", enc.Name(), n)
			}
		}
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	proxy := "http://" + ln.Addr().String()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPkoukkNeverDownloads$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		"KVGATE_TOKENIZE_OFFLINE_CHILD=1",
		"HTTP_PROXY="+proxy, "HTTPS_PROXY="+proxy, "http_proxy="+proxy, "https_proxy="+proxy,
		"NO_PROXY=", "no_proxy=",
		"TIKTOKEN_CACHE_DIR="+t.TempDir(), "DATA_GYM_CACHE_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child failed: %v\n%s", err, out)
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("building pkoukk encoders opened %d connection(s) to the HTTP proxy: it tried to download", n)
	}
}
