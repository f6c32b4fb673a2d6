package tokenize

import "strings"

// Sample is one calibration text of a kind whose token density differs between tokenizers.
type Sample struct {
	Kind string
	Text string
}

// CalibrationSamples are the texts an engine's tokenizer is compared on. Tokenizers disagree
// most on different kinds of text (one that cuts words into short pieces counts plain English at
// several times cl100k, one without merged whitespace runs counts indentation byte by byte), so
// each kind is compared on its own and the worst ratio wins: a mixed text averages the
// disagreement away.
var CalibrationSamples = []Sample{
	{"prose", "The committee reviewed the quarterly report on Thursday and agreed that the new " +
		"process had saved both time and money. Several members asked whether the same approach " +
		"could be used in other departments, and the chair promised to look into it before the " +
		"next meeting. Everyone thanked the team for their careful work over the past few months."},
	{"code", "func (s *Server) handle(w http.ResponseWriter, r *http.Request) {\n\tif err := s.db.Ping(r.Context()); err != nil {\n" +
		"\t\thttp.Error(w, err.Error(), http.StatusServiceUnavailable)\n\t\treturn\n\t}\n" +
		"\tfor i, v := range s.values { total += v * float64(i) }\n}\n" +
		"def parse(path):\n    with open(path) as f:\n        return [json.loads(line) for line in f if line.strip()]\n"},
	{"cjk", "人工智能正在改变我们处理信息的方式，缓存中的数据必须被安全地隔离。" +
		"東京の天気は明日も晴れるでしょう。新しい研究によると、睡眠は記憶に重要です。" +
		"오늘 회의는 오후 세 시에 시작합니다. 자료를 미리 확인해 주세요."},
	{"digits", "3.14159265358979 2718281828459045 0xDEADBEEF 2026-12-02T14:33:22Z 192.168.100.254:8443 " +
		"+1-555-0199 $1,234,567.89 #a1b2c3 {[()]} <=> != && || ;; :: @@ %% ^^ ~~ 12345678901234567890 " +
		"-0.000001e-10 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
	{"repeated", strings.Repeat("a", 256) + " " + strings.Repeat("=", 128) + " " + strings.Repeat("ab", 64) + " " + strings.Repeat("!", 64)},
	{"whitespace", "x" + strings.Repeat(" ", 200) + "y" + strings.Repeat("\n", 40) + "z" + strings.Repeat("\t", 40) +
		"w" + strings.Repeat(" \n", 40) + "v"},
}
