package pdxfer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrTransferTimeout: the room did not arrive within the transfer timeout.
var ErrTransferTimeout = errors.New("transfer timed out")

// Client is decode's side of the transfer: it pulls rooms from a prefill's
// bootstrap port over loopback HTTP.
type Client struct {
	http    *http.Client
	timeout time.Duration
}

// NewClient returns a client that waits at most timeout for a room.
func NewClient(timeout time.Duration) *Client {
	// The wait is bounded by the request context, not by the HTTP client.
	return &Client{http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}, timeout: timeout}
}

// Pull asks the prefill's bootstrap port for a room, waiting at most the
// transfer timeout; an abort of ctx (abort_request) ends it at once.
func (c *Client) Pull(ctx context.Context, host string, port int, room uint64) (*RoomData, error) {
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/room/" + strconv.FormatUint(room, 10) +
		"?wait_ms=" + strconv.FormatInt(c.timeout.Milliseconds(), 10)
	req, err := http.NewRequestWithContext(tctx, "GET", url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if tctx.Err() == context.DeadlineExceeded {
			return nil, ErrTransferTimeout
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == 404 {
		return nil, ErrTransferTimeout
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("bootstrap server answered %d: %s", resp.StatusCode, body)
	}
	var w roomWire
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("decoding room: %w", err)
	}
	return &RoomData{IDs: w.IDs, PromptLen: w.PromptLen, Aborted: w.Aborted, Status: w.Status, Msg: w.Message, RID: w.RID}, nil
}

// LoopbackHost reports whether h names this machine: the simulator only
// transfers KV over loopback.
func LoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(h, "[]"))
	return ip != nil && ip.IsLoopback()
}
