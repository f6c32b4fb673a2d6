package request

// Image parts: read as the engine will receive them, sized from their headers (tokenize/
// imagesize) and counted by the served model's processor rule (tokenize/vision) once the model
// is known. Audio, video and file parts stay refused: no rule counts them.

import (
	"fmt"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/tokenize/imagesize"
	"github.com/kvgate/kvgate/tokenize/vision"
)

// Image is one image of the request: the field that holds it (for errors), and its size as
// its header states it, or Remote for an http(s) URL the gateway does not fetch.
type Image struct {
	Field  string
	Size   imagesize.Size
	Remote bool
	Tokens int // what CountImages charged for it
}

// imageSource reads an image reference: a data: URL with base64 data (sized now), or an
// http(s) URL (Remote). Anything else (a file path, bare base64, another scheme) is refused: an
// engine would read a path from its own disk.
func imageSource(field, url string) (Image, *apierr.Error) {
	img := Image{Field: field}
	lower := strings.ToLower(url[:min(len(url), 8)])
	switch {
	case strings.HasPrefix(lower, "data:"):
		meta, data, ok := strings.Cut(url[5:], ",")
		if !ok || !strings.HasSuffix(strings.ToLower(meta), ";base64") {
			return img, apierr.BadRequest(field, "An image data URL must be data:<media type>;base64,<data>.")
		}
		s, err := imagesize.ReadBase64(data)
		if err != nil {
			return img, apierr.BadRequest(field, fmt.Sprintf("The image could not be read: %v.", err))
		}
		img.Size = s
	case strings.HasPrefix(lower, "https://") || strings.HasPrefix(lower, "http://"):
		img.Remote = true
	default:
		return img, apierr.BadRequest(field, "An image must be a data: URL with base64 data (or an http(s) URL where remote images are allowed).")
	}
	return img, nil
}

// onlyKeys refuses a part's key outside allowed unless its value is empty.
func onlyKeys(field string, m map[string]json.RawMessage, allowed ...string) *apierr.Error {
	var bad []string
	for k, v := range m {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok && !emptyJSON(v) {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	k := bad[0]
	for _, b := range bad[1:] {
		k = min(k, b)
	}
	return apierr.BadRequest(field+"."+k, fmt.Sprintf("Unsupported field %q.", k))
}

// chatImage reads a chat image_url part: {"type": "image_url", "image_url": {"url", "detail"}}.
func chatImage(field string, part map[string]json.RawMessage) (Image, *apierr.Error) {
	if e := onlyKeys(field, part, "type", "image_url"); e != nil {
		return Image{}, e
	}
	field += ".image_url"
	var iu map[string]json.RawMessage
	if json.Unmarshal(part["image_url"], &iu) != nil || iu == nil {
		return Image{}, apierr.BadRequest(field, "'image_url' must be an object with a 'url'.")
	}
	if e := onlyKeys(field, iu, "url", "detail"); e != nil {
		return Image{}, e
	}
	if raw, ok := iu["detail"]; ok && !isNull(raw) {
		var d string
		if !decodeString(raw, &d) || d != "auto" && d != "low" && d != "high" {
			return Image{}, apierr.BadRequest(field+".detail", "'detail' must be auto, low or high.")
		}
	}
	var url string
	if !decodeString(iu["url"], &url) || url == "" {
		return Image{}, apierr.BadRequest(field, "'image_url.url' must be a non-empty string.")
	}
	return imageSource(field, url)
}

// mediaParts are the part types no rule counts.
var mediaParts = map[string]bool{"input_audio": true, "audio": true, "audio_url": true, "video_url": true,
	"video": true, "file": true, "input_file": true, "document": true}

// chatContent reads a chat message's content (field names it): a string, null, or text and
// image parts. It returns the text (parts joined with a space, as engines join them for
// templates that take a string) and the images in order.
func chatContent(field string, raw json.RawMessage) (string, []Image, *apierr.Error) {
	if len(raw) == 0 || isNull(raw) {
		return "", nil, nil
	}
	var s string
	if decodeString(raw, &s) {
		return s, nil, nil
	}
	// Parts are read as maps, not structs: struct decoding matches keys case-insensitively
	// ("TEXT" would fill Text), and the engine reads only the exact names.
	var parts []map[string]json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return "", nil, apierr.BadRequest(field, "'content' must be a string or an array of text and image parts")
	}
	// Errors in a text part name the content (as they always have); an image's name the part.
	var b strings.Builder
	var imgs []Image
	for i, p := range parts {
		if p == nil {
			return "", nil, apierr.BadRequest(field, fmt.Sprintf("content part %d must be an object", i))
		}
		var typ string
		if !decodeString(p["type"], &typ) {
			return "", nil, apierr.BadRequest(field, fmt.Sprintf("content part %d needs a string 'type'", i))
		}
		switch {
		case typ == "text":
			for k := range p {
				if k != "type" && k != "text" {
					return "", nil, apierr.BadRequest(field, fmt.Sprintf("content part %d: unsupported key %q (a text part has exactly 'type' and 'text', case-sensitive)", i, k))
				}
			}
			var t string
			if raw, ok := p["text"]; !ok || isNull(raw) {
				return "", nil, apierr.BadRequest(field, "a text part needs 'text'")
			} else if !decodeString(raw, &t) {
				return "", nil, apierr.BadRequest(field, fmt.Sprintf("content part %d: 'text' must be a string", i))
			}
			if i > 0 {
				b.WriteByte(' ') // engines may join parts with a separator: count one
			}
			b.WriteString(t)
		case typ == "image_url":
			img, e := chatImage(fmt.Sprintf("%s[%d]", field, i), p)
			if e != nil {
				return "", nil, e
			}
			imgs = append(imgs, img)
		case mediaParts[typ] || typ == "image" || typ == "input_image":
			return "", nil, apierr.BadRequest(field, fmt.Sprintf("content parts of type %q are not supported: this gateway accepts text and image_url parts", typ))
		default:
			return "", nil, apierr.BadRequest(field, fmt.Sprintf("unknown content part type %q", typ))
		}
	}
	return b.String(), imgs, nil
}

// templateParts is content as a template that takes parts receives it (SGLang's "openai"
// content format): text parts as sent, each image as {"type": "image"}.
func templateParts(raw json.RawMessage) []any {
	var parts []map[string]json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return nil
	}
	out := make([]any, 0, len(parts))
	for _, p := range parts {
		var typ string
		_ = json.Unmarshal(p["type"], &typ)
		if typ == "image_url" {
			out = append(out, map[string]any{"type": "image"})
			continue
		}
		var t string
		_ = json.Unmarshal(p["text"], &t)
		out = append(out, map[string]any{"type": "text", "text": t})
	}
	return out
}

// responsesImage reads a Responses input_image part: {"type": "input_image", "image_url":
// "<url>", "detail"}; a file_id names stored state the gateway cannot see.
func responsesImage(field string, part map[string]json.RawMessage) (Image, *apierr.Error) {
	if raw, ok := part["file_id"]; ok && !isNull(raw) {
		return Image{}, apierr.BadRequest(field+".file_id", "Images by file_id are not supported: send the image as a data: URL.")
	}
	if e := onlyKeys(field, part, "type", "image_url", "detail", "file_id"); e != nil {
		return Image{}, e
	}
	var url string
	if !decodeString(part["image_url"], &url) || url == "" {
		return Image{}, apierr.BadRequest(field+".image_url", "An input_image needs a string 'image_url'.")
	}
	return imageSource(field+".image_url", url)
}

// anthropicImage reads a Messages image block: {"type": "image", "source": {"type": "base64",
// "media_type", "data"} or {"type": "url", "url"}}.
func anthropicImage(field string, block map[string]json.RawMessage) (Image, *apierr.Error) {
	if e := onlyKeys(field, block, "type", "source", "cache_control"); e != nil {
		return Image{}, e
	}
	field += ".source"
	var src map[string]json.RawMessage
	if json.Unmarshal(block["source"], &src) != nil || src == nil {
		return Image{}, apierr.BadRequest(field, "An image block needs a 'source' object.")
	}
	var typ string
	_ = json.Unmarshal(src["type"], &typ)
	switch typ {
	case "base64":
		if e := onlyKeys(field, src, "type", "media_type", "data"); e != nil {
			return Image{}, e
		}
		var data string
		if !decodeString(src["data"], &data) {
			return Image{}, apierr.BadRequest(field+".data", "'data' must be a base64 string.")
		}
		img := Image{Field: field}
		s, err := imagesize.ReadBase64(data)
		if err != nil {
			return img, apierr.BadRequest(field, fmt.Sprintf("The image could not be read: %v.", err))
		}
		img.Size = s
		return img, nil
	case "url":
		if e := onlyKeys(field, src, "type", "url"); e != nil {
			return Image{}, e
		}
		var url string
		if !decodeString(src["url"], &url) || !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
			return Image{}, apierr.BadRequest(field+".url", "'url' must be an http(s) URL.")
		}
		return Image{Field: field, Remote: true}, nil
	}
	return Image{}, apierr.BadRequest(field+".type", "An image source must be of type base64 or url.")
}

// CountImages charges every image of the request to its prompt, by the served model's rule
// (nil: the model has no preprocessor_config.json, and images are refused). A remote image is
// refused unless remoteAtMax, when it is charged as the largest image the rule makes. Call it
// after RenderTemplate: the template's own tokens for each image (its placeholder) are in the
// rendered count already and are not charged twice, when the rendering holds them.
func (r *Request) CountImages(rule *vision.Rule, remoteAtMax bool) *apierr.Error {
	if len(r.Images) == 0 {
		return nil
	}
	if rule == nil {
		return apierr.BadRequest(r.Images[0].Field, "Images are not supported for this model: the gateway has no image counting rule for it (its tokenizer.hf_dir needs a preprocessor_config.json).")
	}
	total := 0
	for i := range r.Images {
		img := &r.Images[i]
		var c vision.Count
		switch {
		case img.Remote && !remoteAtMax:
			return apierr.BadRequest(img.Field, "Remote image URLs are not fetched by this gateway, so their size cannot be checked: send the image inline as a data: URL with base64 data.")
		case img.Remote:
			c = rule.Max()
		default:
			var err error
			if c, err = turnedEitherWay(rule, img.Size); err != nil {
				return apierr.BadRequest(img.Field, fmt.Sprintf("The image (%d×%d %s) cannot be processed: %v.", img.Size.Width, img.Size.Height, img.Size.Format, err))
			}
		}
		img.Tokens = c.Total
		total += c.Total
	}
	text, n := rule.Rendered()
	if len(r.Prompts) == 1 && r.Prompts[0].Templated && strings.Count(r.Prompts[0].Text, text) >= len(r.Images) {
		// The rendering holds each image's own text, counted with the prompt already.
		total -= n * len(r.Images)
	}
	for i := range r.Prompts {
		r.Prompts[i].ImageTokens = total
	}
	return nil
}

// turnedEitherWay is the larger count of the image as Pillow opens it and turned a quarter: a
// processor that applies EXIF orientations 5–8 (transformers' load_image, exif_transpose) sees
// the sides swapped, one that does not (SGLang today, sglang#33464) sees them as stored, and the
// file's EXIF is not read here, so both are counted whatever it says (the rules of
// tokenize/vision count both alike; a rule that does not is still charged its larger).
func turnedEitherWay(rule *vision.Rule, s imagesize.Size) (vision.Count, error) {
	c, err := rule.Tokens(s.Width, s.Height)
	if err != nil {
		return c, err
	}
	if t, err := rule.Tokens(s.Height, s.Width); err == nil && t.Total > c.Total {
		return t, nil
	}
	return c, nil
}

// addTurnParts records turn i's content as parts (for a template that takes parts).
func (r *Request) addTurnParts(i int, parts []any) {
	for len(r.turnParts) <= i {
		r.turnParts = append(r.turnParts, nil)
	}
	r.turnParts[i] = parts
}

// textOnly is a message with its content's parts of type imageType removed (their images are
// read apart; the text parts go through the route's text reader as before). A content that is
// not a list is kept.
func textOnly(m map[string]json.RawMessage, imageType string) map[string]json.RawMessage {
	var parts []map[string]json.RawMessage
	if json.Unmarshal(m["content"], &parts) != nil {
		return m
	}
	kept := make([]map[string]json.RawMessage, 0, len(parts))
	for _, p := range parts {
		var typ string
		_ = json.Unmarshal(p["type"], &typ)
		if typ != imageType {
			kept = append(kept, p)
		}
	}
	out := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		out[k] = v
	}
	out["content"] = mustJSON(kept)
	return out
}

// responsesImages reads the input_image parts of a Responses message item (field names it).
// parts is nil when it has none; else the item's content as a template that takes parts
// receives it (text parts' text, each image as {"type": "image"}).
func responsesImages(field string, item map[string]json.RawMessage) ([]Image, []any, *apierr.Error) {
	var content []map[string]json.RawMessage
	if json.Unmarshal(item["content"], &content) != nil {
		return nil, nil, nil
	}
	var imgs []Image
	parts := make([]any, 0, len(content))
	for j, p := range content {
		var typ, text string
		_ = json.Unmarshal(p["type"], &typ)
		if typ == "input_image" {
			img, e := responsesImage(fmt.Sprintf("%s.content[%d]", field, j), p)
			if e != nil {
				return nil, nil, e
			}
			imgs = append(imgs, img)
			parts = append(parts, map[string]any{"type": "image"})
			continue
		}
		_ = json.Unmarshal(p["text"], &text)
		parts = append(parts, map[string]any{"type": "text", "text": text})
	}
	if imgs == nil {
		return nil, nil, nil
	}
	return imgs, parts, nil
}

// anthropicImages reads the image blocks of a Messages content (field names it); parts as
// responsesImages' (other blocks as the text anthropicContent counts for them).
func anthropicImages(field string, raw json.RawMessage) ([]Image, []any, *apierr.Error) {
	var blocks []map[string]json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, nil, nil
	}
	var imgs []Image
	parts := make([]any, 0, len(blocks))
	for j, bl := range blocks {
		var typ string
		_ = json.Unmarshal(bl["type"], &typ)
		if typ == "image" {
			img, e := anthropicImage(fmt.Sprintf("%s.%d", field, j), bl)
			if e != nil {
				return nil, nil, e
			}
			imgs = append(imgs, img)
			parts = append(parts, map[string]any{"type": "image"})
			continue
		}
		text, _ := anthropicContent(mustJSON([]map[string]json.RawMessage{bl}))
		parts = append(parts, map[string]any{"type": "text", "text": text})
	}
	if imgs == nil {
		return nil, nil, nil
	}
	return imgs, parts, nil
}
