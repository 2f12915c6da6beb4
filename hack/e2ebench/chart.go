package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"slices"
	"sort"
	"time"
)

var (
	colWith     = color.RGBA{31, 119, 180, 255} // blue
	colWithout  = color.RGBA{44, 160, 44, 255}  // green
	colNoop     = color.RGBA{255, 127, 14, 255} // orange
	colBaseline = color.RGBA{214, 39, 40, 255}  // red
	colAxis     = color.RGBA{0, 0, 0, 255}
	colGrid     = color.RGBA{215, 215, 215, 255}
	colMinor    = color.RGBA{238, 238, 238, 255}
	colText     = color.RGBA{30, 30, 30, 255}
)

type series struct {
	name string
	col  color.RGBA
	lat  []time.Duration // sorted
}

func sortDur(d []time.Duration) { slices.Sort(d) }

// atMostShare is the share of the sorted latencies at most t seconds.
func atMostShare(lat []time.Duration, t float64) float64 {
	d := time.Duration(t * float64(time.Second))
	return float64(sort.Search(len(lat), func(i int) bool { return lat[i] > d })) / float64(len(lat))
}

// panel is a plot area: x is latency on a log scale from 10^lo to 10^hi
// seconds; y runs from ymin (bottom) to ymax (top) in panel units.
type panel struct {
	left, top, right, bottom int
	lo, hi                   float64
	ymin, ymax               float64
}

func (p panel) x(sec float64) int {
	return p.left + int(math.Round((math.Log10(sec)-p.lo)/(p.hi-p.lo)*float64(p.right-p.left)))
}

func (p panel) sec(x int) float64 {
	return math.Pow(10, p.lo+float64(x-p.left)/float64(p.right-p.left)*(p.hi-p.lo))
}

func (p panel) y(v float64) int {
	return p.bottom - int(math.Round((v-p.ymin)/(p.ymax-p.ymin)*float64(p.bottom-p.top)))
}

// writeChart draws the client-side create latency of the modes: the
// distribution on top, its tail below.
func writeChart(path string, r *report) error {
	var all []series
	for m, col := range map[mode]color.RGBA{modeWith: colWith, modeWithout: colWithout, modeNoop: colNoop, modeBaseline: colBaseline} {
		if lat := r.modes[m].lat; len(lat) > 0 {
			all = append(all, series{name: m.String(), col: col, lat: lat})
		}
	}
	slices.SortFunc(all, func(a, b series) int { return colorRank(a.col) - colorRank(b.col) })
	if len(all) == 0 {
		return fmt.Errorf("no latencies to draw")
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range all {
		lo = min(lo, math.Floor(math.Log10(max(s.lat[0].Seconds(), 1e-5))))
		hi = max(hi, math.Ceil(math.Log10(max(s.lat[len(s.lat)-1].Seconds(), 1e-5))))
	}
	if hi <= lo {
		hi = lo + 1
	}

	const w, h, scale = 1100, 1000, 2
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{color.White}, image.Point{}, draw.Src)

	title := fmt.Sprintf("VMIPAM END TO END: CREATE LATENCY, N=%d, C=%d", r.opts.n, r.opts.c)
	drawText(img, (w-textWidth(title, scale))/2, 14, title, scale, colText)
	for i, s := range all {
		y := 48 + i*26
		fillRect(img, 110, y, 128, y+16, s.col)
		label := fmt.Sprintf("%-29s P50 %-9s P99 %-9s %d CREATES", s.name, short(pct(s.lat, 0.5)), short(pct(s.lat, 0.99)), len(s.lat))
		drawText(img, 140, y+1, label, scale, colText)
	}

	top := panel{left: 110, top: 150, right: 1060, bottom: 540, lo: lo, hi: hi, ymin: 0, ymax: 1}
	tail := panel{left: 110, top: 610, right: 1060, bottom: 900, lo: lo, hi: hi, ymin: 1, ymax: 3}
	for _, p := range []panel{top, tail} {
		xGrid(img, p, scale)
	}
	for _, v := range []float64{0, 0.25, 0.5, 0.75, 1} {
		hline(img, top.left, top.right, top.y(v), colGrid)
		l := fmt.Sprintf("%.0f%%", 100*v)
		drawText(img, top.left-12-textWidth(l, scale), top.y(v)-7, l, scale, colText)
	}
	for v, l := range map[float64]string{1: "P90", 2: "P99", 3: "P99.9"} {
		hline(img, tail.left, tail.right, tail.y(v), colGrid)
		drawText(img, tail.left-12-textWidth(l, scale), tail.y(v)-7, l, scale, colText)
	}
	drawTextUp(img, 20, top.bottom-40, "SHARE OF CREATES AT MOST X", scale, colText)
	drawTextUp(img, 20, tail.bottom-40, "PERCENTILE (TAIL)", scale, colText)
	xt := "CLIENT-SIDE CREATE LATENCY (LOG SCALE)"
	drawText(img, (top.left+top.right-textWidth(xt, scale))/2, 950, xt, scale, colText)

	for _, s := range all {
		plot(img, top, s, func(f float64) (float64, bool) { return f, true })
		plot(img, tail, s, func(f float64) (float64, bool) {
			if f < 0.9 {
				return 0, false
			}
			return min(-math.Log10(max(1-f, 1e-9)), 3), true
		})
	}
	for _, p := range []panel{top, tail} {
		rect(img, p.left, p.top, p.right, p.bottom, colAxis)
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func colorRank(c color.RGBA) int {
	switch c {
	case colWith:
		return 0
	case colWithout:
		return 1
	case colNoop:
		return 2
	}
	return 3
}

// short formats a latency for the chart's legend.
func short(d time.Duration) string {
	v := d.Seconds() * 1000
	switch {
	case v < 10:
		return fmt.Sprintf("%.2fMS", v)
	case v < 100:
		return fmt.Sprintf("%.1fMS", v)
	case v < 10000:
		return fmt.Sprintf("%.0fMS", v)
	}
	return fmt.Sprintf("%.1fS", v/1000)
}

// xGrid draws the latency grid (decades and their 2 and 5) and labels the
// decades under the panel.
func xGrid(img *image.RGBA, p panel, scale int) {
	for d := p.lo; d <= p.hi; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			x := p.x(v)
			if x > p.right {
				continue
			}
			c := colMinor
			if m == 1 {
				c = colGrid
			}
			vline(img, x, p.top, p.bottom, c)
			vline(img, x, p.bottom, p.bottom+5, colAxis)
			if m == 1 || p.hi-p.lo <= 3 {
				l := latencyLabel(v)
				drawText(img, x-textWidth(l, scale)/2, p.bottom+12, l, scale, colText)
			}
		}
	}
}

func latencyLabel(sec float64) string {
	switch {
	case sec >= 1:
		return fmt.Sprintf("%gS", sec)
	case sec >= 1e-3:
		return fmt.Sprintf("%gMS", math.Round(sec*1e6)/1e3)
	}
	return fmt.Sprintf("%gUS", math.Round(sec*1e9)/1e3)
}

// plot draws one series' distribution column by column: at each x, the
// share of latencies at most that x, mapped through f into panel units.
func plot(img *image.RGBA, p panel, s series, f func(share float64) (float64, bool)) {
	px, py, have := 0, 0, false
	for x := p.left; x <= p.right; x++ {
		v, ok := f(atMostShare(s.lat, p.sec(x)))
		if !ok {
			have = false
			continue
		}
		y := p.y(v)
		if have {
			thickLine(img, px, py, x, y, s.col)
		}
		px, py, have = x, y, true
	}
}

func thickLine(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	for _, o := range [][2]int{{0, 0}, {1, 0}, {0, 1}, {-1, 0}, {0, -1}} {
		line(img, x0+o[0], y0+o[1], x1+o[0], y1+o[1], c)
	}
}

// line draws with Bresenham's algorithm.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

func rect(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	hline(img, x0, x1, y0, c)
	hline(img, x0, x1, y1, c)
	vline(img, x0, y0, y1, c)
	vline(img, x1, y0, y1, c)
}

func fillRect(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	draw.Draw(img, image.Rect(x0, y0, x1, y1), &image.Uniform{c}, image.Point{}, draw.Src)
}
