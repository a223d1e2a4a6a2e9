// Package healthcheck serves the health-check node ports of
// LoadBalancer services with externalTrafficPolicy=Local.
//
// A cloud load balancer probes http://node:healthCheckNodePort/ on every
// node and sends traffic only to nodes that answer 200: those with a local
// endpoint for the service. The answer is kube-proxy's: 200 or 503 with a
// JSON body naming the service and counting its local endpoints. Servers
// are opened and closed as services come and go.
package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	gosync "sync"
	"time"

	"k8s.io/klog/v2"
)

// Listen opens a TCP listener; tests replace it.
type Listen func(port uint16) (net.Listener, error)

// Server runs one HTTP server per health-check node port.
type Server struct {
	listen Listen
	// ProxyHealthy reports whether the proxy itself keeps up; an unhealthy
	// proxy answers 503 even with local endpoints, as kube-proxy does.
	ProxyHealthy func() bool

	mu       gosync.Mutex
	byKey    map[string]uint16 // service key → port
	services map[uint16]*service
}

type service struct {
	key   string
	local int
	srv   *http.Server
}

// New returns a Server listening on all addresses of the node.
func New() *Server {
	return NewWithListen(func(port uint16) (net.Listener, error) {
		return net.Listen("tcp", fmt.Sprintf(":%d", port))
	})
}

// NewWithListen returns a Server that opens listeners with listen.
func NewWithListen(listen Listen) *Server {
	return &Server{listen: listen, byKey: map[string]uint16{}, services: map[uint16]*service{}}
}

// Update records the health-check port and local endpoint count of a
// service; port 0 means the service needs no health check. A port another
// service already holds is refused with an error.
func (s *Server) Update(key string, port uint16, localEndpoints int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.byKey[key]; ok && old != port {
		s.closeLocked(old)
		delete(s.byKey, key)
	}
	if port == 0 {
		return nil
	}
	if svc, ok := s.services[port]; ok {
		if svc.key != key {
			return fmt.Errorf("health check node port %d is already served for %s", port, svc.key)
		}
		svc.local = localEndpoints
		return nil
	}
	ln, err := s.listen(port)
	if err != nil {
		return fmt.Errorf("health check node port %d: %w", port, err)
	}
	svc := &service{key: key, local: localEndpoints}
	svc.srv = &http.Server{Handler: s.handler(port), ReadHeaderTimeout: 5 * time.Second}
	s.services[port] = svc
	s.byKey[key] = port
	go func() {
		if err := svc.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "Health check server stopped", "service", key, "port", port)
		}
	}()
	return nil
}

// Ports returns the ports being served, for tests and status.
func (s *Server) Ports() map[uint16]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint16]string, len(s.services))
	for p, svc := range s.services {
		out[p] = svc.key
	}
	return out
}

func (s *Server) closeLocked(port uint16) {
	if svc, ok := s.services[port]; ok {
		_ = svc.srv.Close()
		delete(s.services, port)
	}
}

// Close stops every server.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.services {
		s.closeLocked(p)
	}
	s.byKey = map[string]uint16{}
}

type body struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (s *Server) handler(port uint16) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		svc := s.services[port]
		var b body
		if svc != nil {
			b.Service.Namespace, b.Service.Name = splitKey(svc.key)
			b.LocalEndpoints = svc.local
		}
		s.mu.Unlock()
		b.ServiceProxyHealthy = s.ProxyHealthy == nil || s.ProxyHealthy()
		code := http.StatusOK
		if b.LocalEndpoints == 0 || !b.ServiceProxyHealthy {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(b)
	})
}

func splitKey(key string) (string, string) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:]
		}
	}
	return "", key
}
