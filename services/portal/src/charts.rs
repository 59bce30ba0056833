//! Charts the portal draws as SVG, with axes, ticks and units: time series (lines, or
//! steps for amounts held) and stacked bars. Pure: values in, geometry out; the
//! `chart.html` template draws it (and escapes every label).

use askama::Template;
use chrono::{DateTime, Utc};

/// The drawing's size (its viewBox) and the plot area inside it.
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 40.0;
/// Series colours cycle through this many CSS classes (`c0` …).
const COLOURS: usize = 8;

/// A chart ready to draw.
#[derive(Debug, Template)]
#[template(path = "chart.html")]
pub struct Chart {
    /// What it shows, for screen readers and as its caption.
    pub label: String,
    pub y_title: String,
    pub x_title: String,
    pub width: f64,
    pub height: f64,
    pub plot: Plot,
    pub x_ticks: Vec<Tick>,
    pub y_ticks: Vec<Tick>,
    pub lines: Vec<Line>,
    pub bars: Vec<Segment>,
    pub legend: Vec<Legend>,
    /// Nothing to draw: the template says so instead.
    pub empty: bool,
}

impl Chart {
    /// The chart's SVG and legend, as markup for a page (its labels are escaped).
    pub fn html(&self) -> String {
        self.render().unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Plot {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
    pub bottom: f64,
    pub right: f64,
}

/// A labelled position on an axis.
#[derive(Debug, Clone)]
pub struct Tick {
    pub at: f64,
    pub label: String,
    /// How its label sits on it: `middle`, or `start`/`end` at the axis's ends, so no
    /// label runs off the drawing.
    pub anchor: &'static str,
}

/// One series as an SVG polyline.
#[derive(Debug, Clone)]
pub struct Line {
    pub points: String,
    /// Its latest point, marked (a series of one point is a mark alone).
    pub end_x: f64,
    pub end_y: f64,
    pub class: String,
    pub name: String,
    /// Drawn dashed (a reference such as a guarantee).
    pub dashed: bool,
}

/// One part of a stacked bar.
#[derive(Debug, Clone)]
pub struct Segment {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
    pub class: String,
    /// Its tooltip: the series, the column and the value with its unit.
    pub title: String,
}

#[derive(Debug, Clone)]
pub struct Legend {
    pub class: String,
    pub name: String,
    pub dashed: bool,
}

/// A series of a time series chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(DateTime<Utc>, f64)>,
    /// Held from each point to the next (an amount held), rather than joined by slopes.
    pub steps: bool,
    pub dashed: bool,
}

fn plot() -> Plot {
    Plot {
        x: LEFT,
        y: TOP,
        w: WIDTH - LEFT - RIGHT,
        h: HEIGHT - TOP - BOTTOM,
        bottom: HEIGHT - BOTTOM,
        right: WIDTH - RIGHT,
    }
}

/// A round step for about four intervals up to `max`: 1, 2, 2.5 or 5 times a power of ten.
fn nice_step(max: f64) -> f64 {
    if !(max.is_finite() && max > 0.0) {
        return 1.0;
    }
    let raw = max / 4.0;
    let power = 10f64.powf(raw.log10().floor());
    let unit = raw / power;
    let nice = if unit <= 1.0 {
        1.0
    } else if unit <= 2.0 {
        2.0
    } else if unit <= 2.5 {
        2.5
    } else if unit <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// `v` with as many decimals as `step` needs (a step of 0.25 shows 0.75, of 5 shows 15),
/// then `suffix`.
fn tick_label(v: f64, step: f64, suffix: &str) -> String {
    let mut decimals = 0usize;
    while decimals < 6
        && ((step * 10f64.powi(decimals as i32)).round() - step * 10f64.powi(decimals as i32)).abs()
            > 1e-9
    {
        decimals += 1;
    }
    format!("{v:.decimals$}{suffix}")
}

/// Ticks from 0 to at least `max` (or `fixed_top`), each followed by `suffix`, and the
/// top of the axis.
fn y_axis(max: f64, fixed_top: Option<f64>, suffix: &str) -> (f64, Vec<Tick>) {
    let p = plot();
    let (top, step) = match fixed_top {
        Some(top) => (top, nice_step(top)),
        None => {
            let step = nice_step(max);
            (((max / step).ceil() * step).max(step), step)
        }
    };
    let mut ticks = Vec::new();
    let mut v = 0.0;
    while v <= top + step * 1e-9 {
        ticks.push(Tick {
            at: p.bottom - v / top * p.h,
            label: tick_label(v, step, suffix),
            anchor: "end",
        });
        v += step;
    }
    (top, ticks)
}

fn class(i: usize) -> String {
    format!("c{}", i % COLOURS)
}

/// Lines over time from `from` to `to`, with time ticks (hours and minutes, or days over
/// two days), and y from 0 to `y_top` (or a round number above the data), its ticks
/// followed by `suffix` (e.g. `%`).
pub fn time_series(
    label: impl Into<String>,
    y_title: impl Into<String>,
    series: &[Series],
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    y_top: Option<f64>,
    suffix: &str,
) -> Chart {
    let p = plot();
    let span = (to - from).num_seconds().max(1) as f64;
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, v)| *v))
        .fold(0.0, f64::max);
    let (top, y_ticks) = y_axis(max, y_top, suffix);
    let x_of =
        |t: DateTime<Utc>| p.x + ((t - from).num_seconds() as f64 / span).clamp(0.0, 1.0) * p.w;
    let y_of = |v: f64| p.bottom - (v / top).clamp(0.0, 1.0) * p.h;
    let lines: Vec<Line> = series
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.points.is_empty())
        .map(|(i, s)| {
            let mut pts: Vec<(f64, f64)> = Vec::new();
            for (k, (t, v)) in s.points.iter().enumerate() {
                let (x, y) = (x_of(*t), y_of(*v));
                if s.steps && k > 0 {
                    let prev = pts.last().map_or(y, |p| p.1);
                    pts.push((x, prev));
                }
                pts.push((x, y));
            }
            let (mut end_x, end_y) = pts.last().copied().unwrap_or((p.x, p.bottom));
            if s.steps {
                // The last amount is held until the end of the chart.
                pts.push((p.right, end_y));
                end_x = p.right;
            }
            Line {
                end_x,
                end_y,
                points: pts
                    .iter()
                    .map(|(x, y)| format!("{x:.1},{y:.1}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                class: class(i),
                name: s.name.clone(),
                dashed: s.dashed,
            }
        })
        .collect();
    let days = span > 2.0 * 86_400.0;
    let x_ticks = (0..=4)
        .map(|k| {
            let t = from + chrono::Duration::seconds((span * f64::from(k) / 4.0) as i64);
            Tick {
                at: x_of(t),
                label: if days {
                    t.format("%a %d %b").to_string()
                } else {
                    t.format("%H:%M").to_string()
                },
                anchor: match k {
                    0 => "start",
                    4 => "end",
                    _ => "middle",
                },
            }
        })
        .collect();
    let legend = lines
        .iter()
        .map(|l| Legend {
            class: l.class.clone(),
            name: l.name.clone(),
            dashed: l.dashed,
        })
        .collect();
    Chart {
        empty: lines.is_empty(),
        label: label.into(),
        y_title: y_title.into(),
        x_title: if days { "day (UTC)" } else { "time (UTC)" }.into(),
        width: WIDTH,
        height: HEIGHT,
        plot: p,
        x_ticks,
        y_ticks,
        lines,
        bars: Vec::new(),
        legend,
    }
}

/// Bars of stacked series: `columns` are (label, value of each of `names`).
pub fn stacked_bars(
    label: impl Into<String>,
    y_title: impl Into<String>,
    x_title: impl Into<String>,
    names: &[String],
    columns: &[(String, Vec<f64>)],
    show: &dyn Fn(f64) -> String,
) -> Chart {
    let p = plot();
    let max = columns
        .iter()
        .map(|(_, vs)| vs.iter().sum::<f64>())
        .fold(0.0, f64::max);
    let (top, y_ticks) = y_axis(max, None, "");
    let slot = p.w / columns.len().max(1) as f64;
    let w = (slot * 0.7).max(1.0);
    let mut bars = Vec::new();
    let mut x_ticks = Vec::new();
    // Past about 16 columns, every other label is left out so they do not overlap.
    let every = columns.len().div_ceil(16).max(1);
    for (c, (col, values)) in columns.iter().enumerate() {
        let x = p.x + slot * c as f64 + (slot - w) / 2.0;
        let mut base = p.bottom;
        for (i, v) in values.iter().enumerate() {
            if *v <= 0.0 {
                continue;
            }
            let h = v / top * p.h;
            base -= h;
            bars.push(Segment {
                x,
                y: base,
                w,
                h,
                class: class(i),
                title: format!(
                    "{}, {col}: {}",
                    names.get(i).map_or("?", String::as_str),
                    show(*v)
                ),
            });
        }
        if c % every == 0 {
            x_ticks.push(Tick {
                at: x + w / 2.0,
                label: col.clone(),
                anchor: "middle",
            });
        }
    }
    let legend = names
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            columns
                .iter()
                .any(|(_, vs)| vs.get(*i).is_some_and(|v| *v > 0.0))
        })
        .map(|(i, n)| Legend {
            class: class(i),
            name: n.clone(),
            dashed: false,
        })
        .collect();
    Chart {
        empty: bars.is_empty(),
        label: label.into(),
        y_title: y_title.into(),
        x_title: x_title.into(),
        width: WIDTH,
        height: HEIGHT,
        plot: p,
        x_ticks,
        y_ticks,
        lines: Vec::new(),
        bars,
        legend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).expect("time")
    }

    #[test]
    fn tick_labels_have_the_decimals_their_step_needs() {
        assert_eq!(tick_label(0.75, 0.25, ""), "0.75");
        assert_eq!(tick_label(15.0, 5.0, "%"), "15%");
        assert_eq!(tick_label(0.0015, 0.0005, ""), "0.0015");
        assert_eq!(tick_label(2.0, 0.5, ""), "2.0");
    }

    #[test]
    fn steps_are_round_numbers() {
        assert_eq!(nice_step(8.0), 2.0);
        assert_eq!(nice_step(100.0), 25.0);
        assert_eq!(nice_step(3.0), 1.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(17.0), 5.0);
    }

    #[test]
    fn a_full_gpu_reaches_the_top_of_a_percent_axis() {
        let c = time_series(
            "use",
            "GPU busy (%)",
            &[Series {
                name: "job".into(),
                points: vec![(at(0), 0.0), (at(60), 100.0)],
                steps: false,
                dashed: false,
            }],
            (at(0), at(60)),
            Some(100.0),
            "%",
        );
        let p = plot();
        assert_eq!(
            c.lines[0].points,
            format!("{:.1},{:.1} {:.1},{:.1}", p.x, p.bottom, p.right, p.y)
        );
        assert_eq!(c.y_ticks.first().map(|t| t.label.as_str()), Some("0%"));
        assert_eq!(c.y_ticks.last().map(|t| t.label.as_str()), Some("100%"));
        assert_eq!(c.x_ticks.len(), 5);
        assert!(!c.empty);
    }

    #[test]
    fn an_amount_held_is_drawn_as_steps_to_the_end() {
        let c = time_series(
            "held",
            "GPUs",
            &[Series {
                name: "ml".into(),
                points: vec![(at(0), 1.0), (at(30), 2.0)],
                steps: true,
                dashed: false,
            }],
            (at(0), at(60)),
            None,
            "",
        );
        // (0,1) (30,1) (30,2) (end,2): four points.
        assert_eq!(c.lines[0].points.split(' ').count(), 4);
        assert_eq!(c.y_ticks.last().map(|t| t.label.as_str()), Some("2.0"));
    }

    #[test]
    fn stacked_bars_add_up_and_label_every_part() {
        let names = vec!["ml".to_owned(), "cv".to_owned()];
        let c = stacked_bars(
            "GPU-hours",
            "GPU-hours",
            "day",
            &names,
            &[
                ("Mon".into(), vec![3.0, 1.0]),
                ("Tue".into(), vec![0.0, 2.0]),
            ],
            &|v| format!("{v:.1} GPU-hours"),
        );
        assert_eq!(c.bars.len(), 3, "a zero draws nothing");
        let monday: f64 = c.bars.iter().take(2).map(|b| b.h).sum();
        let p = plot();
        assert!(
            (monday - p.h).abs() < 1e-9,
            "the tallest bar fills the axis (top 4)"
        );
        assert_eq!(c.bars[0].title, "ml, Mon: 3.0 GPU-hours");
        assert_eq!(c.legend.len(), 2);
        let none = stacked_bars(
            "x",
            "y",
            "day",
            &names,
            &[("Mon".into(), vec![0.0, 0.0])],
            &|v| v.to_string(),
        );
        assert!(none.empty);
    }
}
