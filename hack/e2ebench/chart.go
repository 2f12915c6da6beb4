package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The modes in the order the chart draws and lists them, with their colours.
var chartModes = []struct {
	m   mode
	col color.RGBA
}{
	{modeWith, color.RGBA{31, 119, 180, 255}},    // blue
	{modeWithout, color.RGBA{44, 160, 44, 255}},  // green
	{modeNoop, color.RGBA{255, 127, 14, 255}},    // orange
	{modeBaseline, color.RGBA{214, 39, 40, 255}}, // red
}

func sortDur(d []time.Duration) { slices.Sort(d) }

// atMostShare is the share of the sorted latencies at most t seconds.
func atMostShare(lat []time.Duration, t float64) float64 {
	d := time.Duration(t * float64(time.Second))
	return float64(sort.Search(len(lat), func(i int) bool { return lat[i] > d })) / float64(len(lat))
}

// chartPoints is how many latencies, evenly spaced on the log scale, each
// curve is drawn through: about one per pixel column.
const chartPoints = 1000

// writeChart draws the client-side create latency of the modes as a PNG:
// the distribution on top, its tail below.
func writeChart(path string, r *report) error {
	type series struct {
		name string
		col  color.RGBA
		lat  []time.Duration // sorted
	}
	var all []series
	for _, cm := range chartModes {
		if lat := r.modes[cm.m].lat; len(lat) > 0 {
			all = append(all, series{name: cm.m.String(), col: cm.col, lat: lat})
		}
	}
	if len(all) == 0 {
		return errors.New("no latencies to draw")
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range all {
		lo = min(lo, math.Floor(math.Log10(max(s.lat[0].Seconds(), 1e-5))))
		hi = max(hi, math.Ceil(math.Log10(max(s.lat[len(s.lat)-1].Seconds(), 1e-5))))
	}
	if hi <= lo {
		hi = lo + 1
	}

	// The header holds only the title and the legend, so that the legend
	// hides no curve.
	header := plot.New()
	header.HideAxes()
	header.Title.Text = fmt.Sprintf("vmipam end to end: create latency, n=%d, c=%d", r.opts.n, r.opts.c)
	header.Title.TextStyle.Font.Size = vg.Points(15)
	header.Legend.Top, header.Legend.Left = true, true
	header.Legend.TextStyle.Font = font.Font{Typeface: "Liberation", Variant: "Mono", Size: vg.Points(11)}
	header.Legend.ThumbnailWidth = vg.Points(24)
	header.Legend.Padding = vg.Points(5)
	header.Legend.XOffs = vg.Points(60)

	top := latencyPlot(lo, hi)
	top.Y.Label.Text = "Share of creates at most x"
	top.Y.Min, top.Y.Max = 0, 1
	top.Y.Tick.Marker = plot.ConstantTicks{{Value: 0, Label: "0%"}, {Value: 0.25, Label: "25%"},
		{Value: 0.5, Label: "50%"}, {Value: 0.75, Label: "75%"}, {Value: 1, Label: "100%"}}

	// The tail: P90 at 1, P99 at 2, P99.9 at 3, i.e. -log10 of the share
	// above x.
	tail := latencyPlot(lo, hi)
	tail.Y.Label.Text = "Percentile (tail)"
	tail.X.Label.Text = "Client-side create latency (log scale)"
	tail.Y.Min, tail.Y.Max = 1, 3
	tail.Y.Tick.Marker = plot.ConstantTicks{{Value: 1, Label: "P90"}, {Value: 2, Label: "P99"}, {Value: 3, Label: "P99.9"}}

	for _, s := range all {
		var dist, tailPts plotter.XYs
		for i := range chartPoints + 1 {
			x := math.Pow(10, lo+(hi-lo)*float64(i)/chartPoints)
			f := atMostShare(s.lat, x)
			dist = append(dist, plotter.XY{X: x, Y: f})
			if f >= 0.9 {
				tailPts = append(tailPts, plotter.XY{X: x, Y: min(-math.Log10(max(1-f, 1e-9)), 3)})
			}
		}
		l, err := curve(dist, s.col)
		if err != nil {
			return err
		}
		top.Add(l)
		if len(tailPts) > 0 {
			t, err := curve(tailPts, s.col)
			if err != nil {
				return err
			}
			tail.Add(t)
		}
		header.Legend.Add(fmt.Sprintf("%-29s p50 %-10s p99 %-10s %d creates", s.name, ms(pct(s.lat, 0.5)), ms(pct(s.lat, 0.99)), len(s.lat)), l)
	}

	const dpi = 100
	img := vgimg.NewWith(vgimg.UseWH(11*vg.Inch, 10*vg.Inch), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	headerH := vg.Points(45) + vg.Points(17)*vg.Length(len(all))
	header.Draw(draw.Crop(dc, 0, 0, dc.Max.Y-dc.Min.Y-headerH, -vg.Points(8)))
	body := draw.Crop(dc, 0, 0, 0, -headerH)
	panels := plot.Align([][]*plot.Plot{{top}, {tail}}, draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Points(10), PadY: vg.Points(20),
		PadTop: vg.Points(5), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(25)}, body)
	top.Draw(panels[0][0])
	tail.Draw(panels[1][0])

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// latencyPlot is a panel whose x axis is latency on a log scale from 10^lo
// to 10^hi seconds, gridded at the decades (and their 2 and 5 when there
// are few decades).
func latencyPlot(lo, hi float64) *plot.Plot {
	p := plot.New()
	p.X.Scale = plot.LogScale{}
	p.X.Min, p.X.Max = math.Pow(10, lo), math.Pow(10, hi)
	var ticks plot.ConstantTicks
	for d := lo; d <= hi; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if v > p.X.Max*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || hi-lo <= 3 {
				t.Label = latencyLabel(v)
			}
			ticks = append(ticks, t)
		}
	}
	p.X.Tick.Marker = ticks
	p.Add(plotter.NewGrid())
	return p
}

func curve(pts plotter.XYs, col color.RGBA) (*plotter.Line, error) {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.Color = col
	l.Width = vg.Points(1.75)
	return l, nil
}

func latencyLabel(sec float64) string {
	switch {
	case sec >= 1:
		return fmt.Sprintf("%gs", sec)
	case sec >= 1e-3:
		return fmt.Sprintf("%gms", math.Round(sec*1e6)/1e3)
	}
	return fmt.Sprintf("%gµs", math.Round(sec*1e9)/1e3)
}
