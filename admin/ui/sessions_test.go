package ui

import (
	"testing"
	"time"
)

func TestSessionsExpireAndEnd(t *testing.T) {
	s := NewSessions(time.Hour)
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	id, sess, err := s.Create(now)
	if err != nil || len(id) != 64 || len(sess.CSRF) != 64 || id == sess.CSRF || !sess.Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("Create: %q %+v %v", id, sess, err)
	}
	if got, ok := s.Get(id, now.Add(59*time.Minute)); !ok || got.CSRF != sess.CSRF {
		t.Fatal("a live session was not found")
	}
	if _, ok := s.Get(id[:63]+"x", now); ok {
		t.Fatal("a wrong id found a session")
	}
	if _, ok := s.Get(id, now.Add(time.Hour)); ok {
		t.Fatal("an expired session was found")
	}
	if s.Len() != 0 {
		t.Fatal("the expired session was not removed")
	}
	id2, _, _ := s.Create(now)
	s.Delete(id2)
	if _, ok := s.Get(id2, now); ok {
		t.Fatal("a deleted session was found")
	}
}

func TestSessionsTableIsBounded(t *testing.T) {
	s := NewSessions(time.Hour)
	now := time.Now()
	first, _, _ := s.Create(now)
	for i := 1; i <= maxSessions; i++ {
		if _, _, err := s.Create(now.Add(time.Duration(i) * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	if s.Len() != maxSessions {
		t.Fatalf("%d sessions held, cap %d", s.Len(), maxSessions)
	}
	if _, ok := s.Get(first, now); ok {
		t.Fatal("the session that expires first should have made room")
	}
}
