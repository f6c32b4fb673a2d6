package admin

// The status page (/admin/ui/): its files, the login that turns the admin key into a session
// cookie, and the session's side of Auth. The page itself calls the admin JSON routes with the
// cookie; state-changing calls also carry the session's CSRF token.

import (
	"crypto/subtle"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/admin/ui"
	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/apierr/respond"
)

// uiPrefix is where the page lives.
const uiPrefix = "/admin/ui/"

// pageHeaders keep the page to its own files (no inline script, no framing, no caching of
// admin data) and its URLs out of other sites' logs.
func pageHeaders(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

func (g *API) sessionTable() *ui.Sessions {
	g.sessionsOnce.Do(func() {
		if g.Sessions == nil {
			g.Sessions = ui.NewSessions(ui.SessionTTL)
		}
	})
	return g.Sessions
}

// statusPage serves /admin/ui and everything under it; false means path is not the page's.
func (g *API) statusPage(ctx *fasthttp.RequestCtx, p, method string) bool {
	if p == "/admin/ui" {
		ctx.Redirect(uiPrefix, fasthttp.StatusMovedPermanently)
		return true
	}
	rest, ok := strings.CutPrefix(p, uiPrefix)
	if !ok {
		return false
	}
	pageHeaders(ctx)
	switch rest {
	case "login":
		if method != fasthttp.MethodPost {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else {
			g.login(ctx)
		}
		return true
	case "logout":
		if method != fasthttp.MethodPost {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if g.Auth(ctx) {
			g.logout(ctx)
		}
		return true
	case "session":
		if method != fasthttp.MethodGet {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if sess, _, ok := g.session(ctx); !ok {
			respond.Error(ctx, apierr.Unauthorized, apierr.OpenAI)
		} else {
			writeJSON(ctx, 200, map[string]any{"csrf_token": sess.CSRF, "expires": sess.Expires.UTC()})
		}
		return true
	}
	if method != fasthttp.MethodGet && method != fasthttp.MethodHead {
		respond.Error(ctx, apierr.Method, apierr.OpenAI)
		return true
	}
	g.pageFile(ctx, rest)
	return true
}

var contentTypes = map[string]string{".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}

// pageFile answers one embedded file; "" is index.html. The files hold no data: no login needed.
func (g *API) pageFile(ctx *fasthttp.RequestCtx, name string) {
	if name == "" {
		name = "index.html"
	}
	ct, known := contentTypes[path.Ext(name)]
	if !known || !fs.ValidPath(name) {
		respond.Error(ctx, apierr.NotFound, apierr.OpenAI)
		return
	}
	body, err := fs.ReadFile(ui.Files(), name)
	if err != nil {
		respond.Error(ctx, apierr.NotFound, apierr.OpenAI)
		return
	}
	ctx.SetContentType(ct)
	ctx.SetBody(body)
}

// login takes the admin key from the form (field "key"), compares its SHA-256 with the
// configured one in constant time, and on a match starts a session. Either way it redirects to
// the page (303), which shows the outcome: a form post has no other way to be answered without
// script.
func (g *API) login(ctx *fasthttp.RequestCtx) {
	body, e := g.ReadBody(ctx, 4096)
	if e != nil {
		respond.Error(ctx, e, apierr.OpenAI)
		return
	}
	args := fasthttp.AcquireArgs()
	defer fasthttp.ReleaseArgs(args)
	args.ParseBytes(body)
	switch g.tryKey(ctx, args.Peek("key"), ViaLogin, g.Key) {
	case keyThrottled:
		return
	case keyWrong:
		g.Log.Warn("status page: failed login", zap.String("client_addr", ctx.RemoteIP().String()))
		ctx.Redirect(uiPrefix+"?login=failed", fasthttp.StatusSeeOther)
		return
	}
	id, sess, err := g.sessionTable().Create(time.Now())
	if err != nil {
		respond.Error(ctx, apierr.StateUnavailable("Could not start a session: "+err.Error()), apierr.OpenAI)
		return
	}
	c := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(c)
	c.SetKey(ui.CookieName)
	c.SetValue(id)
	c.SetPath("/admin/")
	c.SetExpire(sess.Expires)
	c.SetHTTPOnly(true)
	c.SetSameSite(fasthttp.CookieSameSiteStrictMode)
	c.SetSecure(overTLS(ctx))
	ctx.Response.Header.SetCookie(c)
	g.Log.Info("status page: login", zap.String("client_addr", ctx.RemoteIP().String()))
	ctx.Redirect(uiPrefix, fasthttp.StatusSeeOther)
}

func (g *API) logout(ctx *fasthttp.RequestCtx) {
	if _, id, ok := g.session(ctx); ok {
		g.sessionTable().Delete(id)
	}
	c := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(c)
	c.SetKey(ui.CookieName)
	c.SetPath("/admin/")
	c.SetExpire(fasthttp.CookieExpireDelete)
	c.SetHTTPOnly(true)
	c.SetSameSite(fasthttp.CookieSameSiteStrictMode)
	c.SetSecure(overTLS(ctx))
	ctx.Response.Header.SetCookie(c)
	writeJSON(ctx, 200, map[string]any{"logged_out": true})
}

// overTLS: the browser reached us over TLS, here or at a proxy that terminated it and said so in
// X-Forwarded-Proto. A client can forge that header, but only to make its own cookie Secure.
func overTLS(ctx *fasthttp.RequestCtx) bool {
	return ctx.IsTLS() || strings.EqualFold(string(ctx.Request.Header.Peek("X-Forwarded-Proto")), "https")
}

// session is the request's live session, from its cookie.
func (g *API) session(ctx *fasthttp.RequestCtx) (ui.Session, string, bool) {
	if g.Key == nil {
		return ui.Session{}, "", false
	}
	id := string(ctx.Request.Header.Cookie(ui.CookieName))
	sess, ok := g.sessionTable().Get(id, time.Now())
	return sess, id, ok
}

// csrfRefused answers a session's call that changes state without its CSRF token (403).
var csrfRefused = &apierr.Error{Status: 403, Type: "invalid_request_error", Code: "csrf_token_invalid", Param: ui.CSRFHeader,
	Message: "A state-changing call with the status page's session needs its CSRF token in the " + ui.CSRFHeader + " header."}

// sessionAuth is Auth for a request without a bearer key: a live session cookie, and for any
// method but GET and HEAD the session's CSRF token too. It writes the refusal.
func (g *API) sessionAuth(ctx *fasthttp.RequestCtx) bool {
	sess, _, ok := g.session(ctx)
	if !ok {
		respond.Error(ctx, apierr.Unauthorized, apierr.OpenAI)
		return false
	}
	if ctx.IsGet() || ctx.IsHead() {
		return true
	}
	token := ctx.Request.Header.Peek(ui.CSRFHeader)
	if subtle.ConstantTimeCompare(token, []byte(sess.CSRF)) != 1 {
		respond.Error(ctx, csrfRefused, apierr.OpenAI)
		return false
	}
	return true
}
