package leaklab

import (
	"fmt"
	"html"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The plots are hand-written SVG: a fixed frame, categorical x positions,
// a linear y axis, no plotting dependency.
const (
	svgW, svgH             = 640, 400
	padL, padR, padT, padB = 70, 20, 50, 70
)

type series struct {
	name  string
	color string
	ys    []float64
}

func svgHeader(b *strings.Builder, title string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(title))
}

// frame draws axes, y ticks from 0 to ymax and the x labels; it returns the
// mapping of (index, value) to pixels.
func frame(b *strings.Builder, xLabels []string, ymax float64, xTitle, yTitle string) (func(i int) float64, func(y float64) float64) {
	pw, ph := float64(svgW-padL-padR), float64(svgH-padT-padB)
	n := len(xLabels)
	xAt := func(i int) float64 { return float64(padL) + pw*(float64(i)+0.5)/float64(max(n, 1)) }
	yAt := func(y float64) float64 { return float64(padT) + ph*(1-y/ymax) }
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", padL, padT, padL, svgH-padB)
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", padL, svgH-padB, svgW-padR, svgH-padB)
	for k := 0; k <= 5; k++ {
		y := ymax * float64(k) / 5
		py := yAt(y)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", padL, py, svgW-padR, py)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, py+4, strconv.FormatFloat(y, 'g', 3, 64))
	}
	for i, l := range xLabels {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", xAt(i), svgH-padB+18, html.EscapeString(l))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", padL+int(pw)/2, svgH-padB+42, html.EscapeString(xTitle))
	fmt.Fprintf(b, `<text x="18" y="%d" text-anchor="middle" transform="rotate(-90 18 %d)">%s</text>`+"\n", padT+int(ph)/2, padT+int(ph)/2, html.EscapeString(yTitle))
	return xAt, yAt
}

func lineChart(title string, xLabels []string, ss []series, ymax float64, xTitle, yTitle string) string {
	var b strings.Builder
	svgHeader(&b, title)
	xAt, yAt := frame(&b, xLabels, ymax, xTitle, yTitle)
	for si, s := range ss {
		var pts []string
		for i, y := range s.ys {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xAt(i), yAt(y)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		for i, y := range s.ys {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xAt(i), yAt(y), s.color)
		}
		lx := svgW - padR - 150
		ly := padT + 16*si
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="3" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", lx, ly, s.color, lx+18, ly+5, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func barChart(title string, xLabels []string, ys []float64, ymax float64, xTitle, yTitle string) string {
	var b strings.Builder
	svgHeader(&b, title)
	xAt, yAt := frame(&b, xLabels, ymax, xTitle, yTitle)
	bw := float64(svgW-padL-padR) / float64(max(len(xLabels), 1)) * 0.6
	for i, y := range ys {
		top := yAt(y)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4477aa"/>`+"\n", xAt(i)-bw/2, top, bw, yAt(0)-top)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", xAt(i), top-4, strconv.FormatFloat(y, 'g', 3, 64))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	for _, m := range []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000} {
		if v <= m {
			return m
		}
	}
	return v
}

func val(x *float64) float64 {
	if x == nil {
		return 0
	}
	return *x
}

// WriteSVG writes one plot for a report into dir as <experiment>.svg and
// returns the file's path.
func WriteSVG(dir string, r *Report) (string, error) {
	var doc string
	switch r.Experiment {
	case "warmup":
		var labels []string
		var leak, det []float64
		for _, x := range r.Rows {
			row := x.(WarmupRow)
			labels = append(labels, strconv.Itoa(row.WarmupSteps))
			leak, det = append(leak, row.LeakRate), append(det, row.DetectRate)
		}
		doc = lineChart("Leak and detection rate against warm-up", labels,
			[]series{{"leak rate", "#cc3311", leak}, {"detect rate", "#0077bb", det}}, 1, "warm-up steps", "share of trials")
	case "warm":
		const bins = 10
		counts := make([]float64, bins)
		for _, t := range r.Trials {
			k := min(int(t.ForeignShare*bins), bins-1)
			counts[k]++
		}
		labels := make([]string, bins)
		ymax := 0.0
		for k := range labels {
			labels[k] = fmt.Sprintf("%.1f", float64(k)/bins)
			ymax = max(ymax, counts[k])
		}
		doc = barChart("Foreign share of the context (warm pool)", labels, counts, niceMax(ymax), "foreign share (bin start)", "trials")
	case "allocators":
		var labels []string
		var ys []float64
		ymax := 0.0
		for _, x := range r.Rows {
			row := x.(AllocatorRow)
			labels = append(labels, row.Allocator)
			ys = append(ys, val(row.TenantsMedian))
			ymax = max(ymax, val(row.TenantsMedian))
		}
		doc = barChart("Distinct tenants read, per allocator (median)", labels, ys, niceMax(ymax), "allocator", "tenants")
	case "fixes":
		var labels []string
		var ys []float64
		for _, x := range r.Rows {
			row := x.(FixRow)
			labels = append(labels, row.Fix)
			ys = append(ys, val(row.ForeignShareMedian))
		}
		doc = barChart("Foreign share per engine fix (median)", labels, ys, 1, "fix", "foreign share")
	default:
		return "", fmt.Errorf("no plot for %q", r.Experiment)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, r.Experiment+".svg")
	return path, os.WriteFile(path, []byte(doc), 0o644)
}
