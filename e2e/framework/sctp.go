//go:build e2e

package framework

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SCTP traffic: Go's net package has no SCTP, so the client speaks it
// through one-to-one style sockets (SOCK_STREAM, IPPROTO_SCTP) and the
// pods run `e2ectl sctp`. The kernel's sctp module is loaded on demand.

// SCTPServer is an `e2ectl sctp` process inside a pod's namespace.
type SCTPServer struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// ServeSCTP starts an SCTP server in the pod answering with its name on
// p.IP:port, and waits until it accepts an association. Stop it before
// the pod (Pod.Stop only ends the pod's own backend).
func (p *Pod) ServeSCTP(port int, logDir string) (*SCTPServer, error) {
	ctl := os.Getenv("E2E_CTL")
	if ctl == "" {
		return nil, fmt.Errorf("E2E_CTL (path of the e2ectl binary) is not set")
	}
	cmd := exec.Command("ip", "netns", "exec", p.netns, ctl, "sctp",
		"--name", p.Name, "--ip", p.IP, "--port", strconv.Itoa(port))
	if logDir != "" {
		f, err := os.Create(filepath.Join(logDir, "pod-"+p.Name+"-sctp.log"))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cmd.Stdout, cmd.Stderr = f, f
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &SCTPServer{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	err := Eventually(PodStartTimeout, 200*time.Millisecond, func() error {
		select {
		case <-s.done:
			return Permanent(fmt.Errorf("pod %s: e2ectl sctp exited", p.Name))
		default:
		}
		name, err := AskSCTP("", p.IP, port)
		if err == nil && name != p.Name {
			err = fmt.Errorf("pod %s answered SCTP as %q", p.Name, name)
		}
		return err
	})
	if err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Stop kills the server.
func (s *SCTPServer) Stop() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
}

// AskSCTP opens one SCTP association to ip:port (IPv4), from the local
// address src when given, and returns the name the server sent. Binding
// one source address keeps the INIT free of further addresses, so the
// association uses the single path IPVS translates. It gives up after 3 s.
func AskSCTP(src, ip string, port int) (string, error) {
	dst, err := netip.ParseAddr(ip)
	if err != nil || !dst.Is4() {
		return "", fmt.Errorf("AskSCTP: %q is not an IPv4 address", ip)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return "", fmt.Errorf("sctp socket: %w", err)
	}
	defer unix.Close(fd)
	if src != "" {
		a, err := netip.ParseAddr(src)
		if err != nil || !a.Is4() {
			return "", fmt.Errorf("AskSCTP: source %q is not an IPv4 address", src)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: a.As4()}); err != nil {
			return "", fmt.Errorf("sctp bind %s: %w", src, err)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: dst.As4(), Port: port}); err != nil && err != unix.EINPROGRESS {
		return "", fmt.Errorf("sctp connect %s:%d: %w", ip, port, err)
	}
	if err := waitFD(fd, unix.POLLOUT, deadline); err != nil {
		return "", fmt.Errorf("sctp connect %s:%d: %w", ip, port, err)
	}
	if soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soErr != 0 {
		return "", fmt.Errorf("sctp connect %s:%d: %v", ip, port, errOr(err, syscall.Errno(soErr)))
	}
	buf := make([]byte, 512)
	for {
		if err := waitFD(fd, unix.POLLIN, deadline); err != nil {
			return "", fmt.Errorf("sctp read from %s:%d: %w", ip, port, err)
		}
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("sctp read from %s:%d: %w", ip, port, err)
		}
		if n == 0 {
			return "", fmt.Errorf("sctp %s:%d: association closed without data", ip, port)
		}
		return strings.TrimSpace(string(buf[:n])), nil
	}
}

// waitFD polls fd for events until deadline.
func waitFD(fd int, events int16, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("timed out")
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(pfd, int(left/time.Millisecond)+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
}

func errOr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}
