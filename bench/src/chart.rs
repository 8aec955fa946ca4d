//! PNG charts of a run: uncontended latency distributions, handoff by waiter count, and
//! hot-key fairness. Drawn with plotters' bitmap backend; text with a TrueType font read
//! at run time (plotters' `ab_glyph`), so no system font configuration is needed.
//! [`draw_charts`] takes each chart's data from the run's results.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::growth;
use crate::peers::Peer;
use crate::plan::{HOT_KEY_CONTENDERS, TARGET_FAIRNESS, WAITERS};
use crate::results::Results;

/// Where [`find_font`] looks, in order (Debian's `fonts-dejavu-core` first).
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];
/// The font family the charts' text is drawn in (the font [`register`] loaded).
pub(crate) const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (1000, 600);

/// The first font of [`FONT_PATHS`] that exists, or `explicit`.
pub fn find_font(explicit: Option<&Path>) -> Option<PathBuf> {
    match explicit {
        Some(p) => Some(p.to_owned()),
        None => FONT_PATHS.iter().map(PathBuf::from).find(|p| p.is_file()),
    }
}

/// Loads `path` as the charts' font (once per process: plotters keeps it for ever).
pub fn register(path: &Path) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font(FONT, FontStyle::Normal, bytes)
        .map_err(|_| format!("{}: not a TrueType/OpenType font", path.display()))
}

/// The charts written, or why none were.
pub(crate) struct Charts {
    /// The directory, as given.
    pub(crate) dir: PathBuf,
    pub(crate) latency: Option<String>,
    pub(crate) handoff: Option<String>,
    pub(crate) fairness: Option<String>,
    /// How cost grows (see [`crate::growth`]).
    pub(crate) held_growth: Option<String>,
    pub(crate) handoff_growth: Option<String>,
    pub(crate) error: Option<String>,
}

/// Draws the charts of a run into `dir` (created if need be), each from its part of the
/// results; errors go to stderr and into [`Charts::error`].
pub(crate) fn draw_charts(r: &Results, dir: &Path, font: Option<&Path>) -> Charts {
    let mut charts = Charts {
        dir: dir.to_owned(),
        latency: None,
        handoff: None,
        fairness: None,
        held_growth: None,
        handoff_growth: None,
        error: None,
    };
    let prepared = (|| {
        let font = find_font(font).ok_or(
            "no TrueType font found (install fonts-dejavu-core, or pass --font FILE)".to_owned(),
        )?;
        register(&font)?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
    })();
    if let Err(e) = prepared {
        eprintln!("charts not drawn: {e}");
        charts.error = Some(e);
        return charts;
    }
    let mut errors = Vec::new();
    let mut draw = |file: &str, f: &dyn Fn(&Path) -> Result<(), String>| {
        let path = dir.join(file);
        match f(&path) {
            Ok(()) => {
                eprintln!("chart: {}", path.display());
                Some(file.to_owned())
            }
            Err(e) => {
                errors.push(format!("{file}: {e}"));
                None
            }
        }
    };
    if let Ok(lat) = &r.latency {
        let mut series: Vec<(String, &[u64])> = lat
            .single
            .iter()
            .map(|(p, s)| (p.label().to_owned(), s.samples.as_slice()))
            .collect();
        for (p, s) in r.python_latency.iter() {
            if let Ok(run) = s {
                series.push((p.label().to_owned(), run.cycles.samples.as_slice()));
            }
        }
        let node = r.node_latency.as_ref().and_then(|n| n.single.as_ref().ok());
        if let Some(run) = node {
            let label = Peer::NodeRedlock.label().to_owned();
            series.push((label, run.cycles.samples.as_slice()));
        }
        series.push(("PING (redis-rs)".to_owned(), lat.ping.samples.as_slice()));
        if let Some(Ok(run)) = r.python_latency.first().map(|(_, s)| s) {
            series.push(("PING (redis-py)".to_owned(), run.pings.samples.as_slice()));
        }
        if let Some(run) = node {
            series.push(("PING (ioredis)".to_owned(), run.pings.samples.as_slice()));
        }
        charts.latency = draw("latency.png", &|p| {
            latency_cdf(
                p,
                "Uncontended acquire + release, one client, single node",
                &series,
            )
        });
    }
    let rows: Vec<(String, Vec<Option<u64>>)> = Peer::ALL
        .iter()
        .filter(|p| r.handoff.iter().any(|h| h.peer == **p))
        .map(|&p| {
            let p50s = WAITERS
                .iter()
                .map(|&w| {
                    r.handoff
                        .iter()
                        .find(|h| h.peer == p && h.waiters == w)
                        .and_then(|h| h.summary)
                        .map(|s| s.p50)
                })
                .collect();
            (p.label().to_owned(), p50s)
        })
        .collect();
    charts.handoff = draw("handoff.png", &|p| {
        handoff(
            p,
            "Handoff: release to next holder in another process, p50",
            &WAITERS,
            &rows,
        )
    });
    let rows: Vec<(String, f64, f64)> = r
        .hot_key
        .iter()
        .map(|h| (h.peer.label().to_owned(), h.fairness(), h.per_second()))
        .collect();
    charts.fairness = draw("fairness.png", &|p| {
        fairness(
            p,
            &format!("Hot key, {HOT_KEY_CONTENDERS} contenders, empty critical section"),
            TARGET_FAIRNESS,
            &rows,
        )
    });
    (charts.held_growth, charts.handoff_growth) = growth::draw(r, &mut draw);
    if !errors.is_empty() {
        eprintln!("charts: {}", errors.join("; "));
        charts.error = Some(errors.join("; "));
    }
    charts
}

/// One colour per lock, the same in every chart; other series (PINGs) after them.
pub(crate) fn color(label: &str, fallback: usize) -> RGBAColor {
    let i = Peer::ALL
        .iter()
        .position(|p| p.label() == label)
        .unwrap_or(Peer::ALL.len() + fallback);
    Palette99::pick(i).to_rgba()
}

/// A plotters error, as the charts report it.
pub(crate) fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Latency distributions: for each series (sorted samples, ns), the fraction of cycles
/// at or under each latency; log time axis.
pub fn latency_cdf(path: &Path, title: &str, series: &[(String, &[u64])]) -> Result<(), String> {
    let lo = series
        .iter()
        .filter_map(|(_, s)| s.first())
        .min()
        .copied()
        .unwrap_or(1_000)
        .max(1_000) as f64
        / 1e6;
    // Up to the 99.9th percentile of the slowest series (the max is one outlier).
    let hi = series
        .iter()
        .filter_map(|(_, s)| s.get((s.len() as f64 * 0.999) as usize).or(s.last()))
        .max()
        .copied()
        .unwrap_or(1_000_000) as f64
        / 1e6;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo * 0.8..hi * 1.25).log_scale(), 0f64..1f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("acquire + release, ms (log scale)")
        .y_desc("fraction of cycles at or under")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .x_label_formatter(&|v| fmt_ms(*v))
        .draw()
        .map_err(err)?;
    for (i, (label, samples)) in series.iter().enumerate() {
        if samples.is_empty() {
            continue;
        }
        let color = color(label, i);
        let points = (0..=400).map(|k| {
            let q = k as f64 / 400.0;
            let idx = ((samples.len() - 1) as f64 * q) as usize;
            (samples[idx] as f64 / 1e6, q)
        });
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Handoff p50 by waiter count, one line per lock (log-log).
pub fn handoff(
    path: &Path,
    title: &str,
    waiters: &[usize],
    rows: &[(String, Vec<Option<u64>>)],
) -> Result<(), String> {
    let values = rows
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .map(|&ns| ns as f64 / 1e6);
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi { (0.01, 1000.0) } else { (lo, hi) };
    let xmax = waiters.iter().max().copied().unwrap_or(64) as f64;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (0.8f64..xmax * 1.3).log_scale(),
            (lo * 0.6..hi * 1.6).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("waiters (log scale)")
        .y_desc("handoff p50, ms (log scale)")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| fmt_ms(*v))
        .draw()
        .map_err(err)?;
    for (i, (label, p50s)) in rows.iter().enumerate() {
        let color = color(label, i);
        let points: Vec<(f64, f64)> = waiters
            .iter()
            .zip(p50s)
            .filter_map(|(&w, p)| p.map(|ns| (w as f64, ns as f64 / 1e6)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Hot-key fairness: min/max acquisitions per contender, one bar per lock (the first
/// on top), with the target line; each bar annotated with the acquisitions per second.
pub fn fairness(
    path: &Path,
    title: &str,
    target: f64,
    rows: &[(String, f64, f64)],
) -> Result<(), String> {
    if rows.is_empty() {
        return Err("no hot-key rows to draw".to_owned());
    }
    let n = rows.len() as i32;
    // Row `k` of `rows` is drawn in segment `n - 1 - k`, so the first is on top.
    let rows: Vec<&(String, f64, f64)> = rows.iter().rev().collect();
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..1.35f64, (0..n - 1).into_segmented())
        .map_err(err)?;
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("min / max acquisitions per contender (1 = perfectly even)")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .y_labels(rows.len())
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => names
                .get(usize::try_from(*i).unwrap_or(usize::MAX))
                .cloned()
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .draw()
        .map_err(err)?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, &(label, ratio, _))| {
            let color = color(label, 0);
            let i = i as i32;
            let mut bar = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(i)),
                    (ratio.clamp(0.0, 1.0), SegmentValue::Exact(i + 1)),
                ],
                color.filled(),
            );
            bar.set_margin(6, 6, 0, 0);
            bar
        }))
        .map_err(err)?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, &(_, ratio, rate))| {
            Text::new(
                format!("{ratio:.2}  ({rate:.0} acq/s)"),
                (
                    ratio.clamp(0.0, 1.0) + 0.01,
                    SegmentValue::CenterOf(i as i32),
                ),
                (FONT, 14),
            )
        }))
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![
                (target, SegmentValue::Exact(0)),
                (target, SegmentValue::Last),
            ],
            RED.stroke_width(2),
        )))
        .map_err(err)?
        .label(format!("target for fair mode: {target}"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// `0.05 ms`, `1.2 ms`, `150 ms` (any axis value: two significant digits or more).
pub(crate) fn fmt_ms(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else if v >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_keep_two_significant_digits_or_more() {
        assert_eq!(fmt_ms(150.0), "150");
        assert_eq!(fmt_ms(1.25), "1.2");
        assert_eq!(fmt_ms(0.25), "0.25");
        assert_eq!(fmt_ms(0.05), "0.050");
    }

    #[test]
    fn every_lock_has_its_own_colour() {
        let colours: Vec<_> = Peer::ALL.iter().map(|p| color(p.label(), 0)).collect();
        for (i, a) in colours.iter().enumerate() {
            for b in &colours[i + 1..] {
                assert_ne!((a.0, a.1, a.2), (b.0, b.1, b.2));
            }
        }
    }
}
