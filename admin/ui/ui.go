// Package ui is the operator's status page: its files, embedded in the binary (plain HTML, CSS
// and JavaScript, no CDN, no build step), and the login sessions that let a browser read the admin
// API without holding the admin key after it signed in. Package admin serves both.
package ui

import (
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"sync"
	"time"
)

//go:embed static
var static embed.FS

// Files are the page's files: index.html, app.js, style.css.
func Files() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embed pattern names the folder: this cannot happen
	}
	return sub
}

// CookieName is the session cookie.
const CookieName = "kvgate_admin_session"

// CSRFHeader carries the session's CSRF token on every state-changing call the page makes
// (the cookie alone is not enough, even with SameSite=Strict).
const CSRFHeader = "X-Kvgate-Csrf"

// SessionTTL is a session's whole life from login: long enough for an incident, short enough
// that a forgotten browser tab does not stay an admin for days.
const SessionTTL = 8 * time.Hour

// maxSessions bounds the table: logins past it push out the session that expires first.
const maxSessions = 1024

// Session is one signed-in browser.
type Session struct {
	CSRF    string
	Expires time.Time
}

// Sessions are held in this replica's memory: behind several replicas the page needs sticky
// sessions, or a port-forward to one pod. Sessions are found by the SHA-256 of their id, so a
// lookup's timing says nothing about how much of a guessed id was right.
type Sessions struct {
	mu  sync.Mutex
	m   map[[32]byte]Session
	ttl time.Duration
}

// NewSessions is an empty table whose sessions last ttl.
func NewSessions(ttl time.Duration) *Sessions {
	return &Sessions{m: map[[32]byte]Session{}, ttl: ttl}
}

func randomToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// Create starts a session: its id (the cookie's value) and the session.
func (s *Sessions) Create(now time.Time) (string, Session, error) {
	id, err := randomToken()
	if err != nil {
		return "", Session{}, err
	}
	csrf, err := randomToken()
	if err != nil {
		return "", Session{}, err
	}
	sess := Session{CSRF: csrf, Expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.m {
		if !now.Before(v.Expires) {
			delete(s.m, k)
		}
	}
	if len(s.m) >= maxSessions {
		var first [32]byte
		var at time.Time
		for k, v := range s.m {
			if at.IsZero() || v.Expires.Before(at) {
				first, at = k, v.Expires
			}
		}
		delete(s.m, first)
	}
	s.m[sha256.Sum256([]byte(id))] = sess
	return id, sess, nil
}

// Get is the live session with id; an expired one is removed and not found.
func (s *Sessions) Get(id string, now time.Time) (Session, bool) {
	if id == "" {
		return Session{}, false
	}
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[k]
	if ok && !now.Before(sess.Expires) {
		delete(s.m, k)
		return Session{}, false
	}
	return sess, ok
}

// Delete ends the session with id (logout).
func (s *Sessions) Delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, sha256.Sum256([]byte(id)))
}

// Len is how many sessions are held (expired ones included until the next login prunes them).
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
