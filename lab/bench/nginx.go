package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// findNginx is the nginx binary to compare with: -nginx, else nginx on PATH, else Debian's
// /usr/sbin/nginx (not on every user's PATH). "" when there is none or -nginx is "none".
func findNginx(flag string) string {
	if flag == "none" {
		return ""
	}
	if flag != "" {
		return flag
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	return ""
}

// nginxConfig writes a foreground nginx config into dir: proxy_pass to upstream with keepalive
// connections (HTTP/1.1, Connection cleared), buffering off so event streams pass event by
// event, one worker per core, an access log like kvgate's, every path inside dir.
func nginxConfig(dir, name, listen, upstream string) (string, error) {
	return nginxConfigWorkers(dir, name, listen, upstream, "auto")
}

// nginxConfigWorkers is nginxConfig with worker_processes set (the proxy-alone phase: one per
// core it is pinned to).
func nginxConfigWorkers(dir, name, listen, upstream, workers string) (string, error) {
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Join(d, "tmp"), 0o755); err != nil {
		return "", err
	}
	conf := fmt.Sprintf(`daemon off;
master_process on;
worker_processes %[4]s;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 16384; }
http {
    access_log %[1]s/access.log;
    client_body_temp_path %[1]s/tmp/body;
    proxy_temp_path %[1]s/tmp/proxy;
    fastcgi_temp_path %[1]s/tmp/fastcgi;
    uwsgi_temp_path %[1]s/tmp/uwsgi;
    scgi_temp_path %[1]s/tmp/scgi;
    keepalive_requests 1000000;
    upstream engine {
        server %[3]s;
        keepalive 512;
        keepalive_requests 1000000;
    }
    server {
        listen %[2]s;
        location / {
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
`, d, listen, upstream, workers)
	path := filepath.Join(d, "nginx.conf")
	return path, os.WriteFile(path, []byte(conf), 0o644)
}

// nginxArgv runs it in the foreground with its prefix and startup error log in dir too.
func nginxArgv(bin, conf string) []string {
	d := filepath.Dir(conf)
	return []string{bin, "-p", d, "-c", conf, "-e", filepath.Join(d, "error.log")}
}
