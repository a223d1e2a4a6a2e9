//go:build e2e

package framework

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Every request opens a fresh connection (or UDP socket), so IPVS
// schedules each one and round-robin across pods becomes visible.

var httpClient = &http.Client{
	Timeout:   3 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
}

// GetTCP sends one HTTP GET to ip:port and returns the name of the pod
// that answered.
func GetTCP(ip string, port int) (string, error) {
	resp, err := httpClient.Get("http://" + net.JoinHostPort(ip, strconv.Itoa(port)) + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	return strings.TrimSpace(string(body)), nil
}

// AskUDP sends one datagram to ip:port from a new socket and returns the
// name in the reply.
func AskUDP(ip string, port int) (string, error) {
	c, err := net.Dial("udp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("who\n")); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

// Tally is the outcome of a series of requests: answers per pod and errors.
type Tally struct {
	ByPod  map[string]int
	Errors []error
}

// Total is the number of requests made.
func (t Tally) Total() int {
	n := len(t.Errors)
	for _, c := range t.ByPod {
		n += c
	}
	return n
}

func (t Tally) String() string {
	s := fmt.Sprintf("%d requests, answers by pod %v, %d failed", t.Total(), t.ByPod, len(t.Errors))
	if len(t.Errors) > 0 {
		s += fmt.Sprintf(" (first: %v)", t.Errors[0])
	}
	return s
}

// Ask is GetTCP or AskUDP.
type Ask func(ip string, port int) (string, error)

// Repeat makes n requests one after the other.
func Repeat(ask Ask, ip string, port, n int) Tally {
	t := Tally{ByPod: map[string]int{}}
	for i := 0; i < n; i++ {
		name, err := ask(ip, port)
		if err != nil {
			t.Errors = append(t.Errors, err)
			continue
		}
		t.ByPod[name]++
	}
	return t
}

// Loop makes requests back to back, every interval, until Stop; it is the
// client that must see no failure while ipvsproxy restarts.
type Loop struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	t    Tally
}

// StartLoop begins requesting ip:port in the background.
func StartLoop(ask Ask, ip string, port int, interval time.Duration) *Loop {
	l := &Loop{stop: make(chan struct{}), t: Tally{ByPod: map[string]int{}}}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			name, err := ask(ip, port)
			l.mu.Lock()
			if err != nil {
				l.t.Errors = append(l.t.Errors, fmt.Errorf("%s: %w", time.Now().Format("15:04:05.000"), err))
			} else {
				l.t.ByPod[name]++
			}
			l.mu.Unlock()
			time.Sleep(interval)
		}
	}()
	return l
}

// Snapshot returns the tally so far.
func (l *Loop) Snapshot() Tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := Tally{ByPod: map[string]int{}, Errors: append([]error(nil), l.t.Errors...)}
	for k, v := range l.t.ByPod {
		t.ByPod[k] = v
	}
	return t
}

// Stop ends the loop and returns the final tally.
func (l *Loop) Stop() Tally {
	close(l.stop)
	l.wg.Wait()
	return l.Snapshot()
}
