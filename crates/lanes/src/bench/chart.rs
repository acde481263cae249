//! PNG bar charts of bench results: one group of bars per pattern, one series per
//! configuration (each a `lanes bench --json` file), drawn with plotters' bitmap backend.
//!
//! Text is drawn with a TrueType font read at run time (DejaVu Sans from Debian's
//! fonts-dejavu-core, or `LANES_CHART_FONT`), so the binary needs no fontconfig or freetype.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use plotters::coord::combinators::BindKeyPoints;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;
use serde_json::Value;

use super::pattern;

/// Where Debian's fonts-dejavu-core puts its sans-serif face.
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// The font family name the chart asks plotters for.
const FAMILY: &str = "sans-serif";

#[derive(Debug, Args)]
pub struct ChartArgs {
    /// The PNG file to write.
    #[arg(value_name = "OUT.png")]
    out: PathBuf,
    /// `lanes bench --json` files, one series each (named by its "label", else the file name).
    #[arg(value_name = "IN.json", required = true)]
    inputs: Vec<PathBuf>,
    /// What the bars show.
    #[arg(long, value_enum, default_value_t = Metric::MbPerS)]
    metric: Metric,
    /// The chart's title.
    #[arg(long)]
    title: Option<String>,
    /// Image width in pixels.
    #[arg(long, default_value_t = 1280)]
    width: u32,
    /// Image height in pixels.
    #[arg(long, default_value_t = 720)]
    height: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Metric {
    /// Throughput, MB/s (10^6 bytes per second).
    #[value(name = "mbps")]
    MbPerS,
    /// I/O operations per second.
    Iops,
    /// Average latency, microseconds.
    #[value(name = "avg-lat")]
    AvgLat,
    /// 99th percentile latency, microseconds.
    #[value(name = "p99-lat")]
    P99Lat,
}

impl Metric {
    fn key(self) -> &'static str {
        match self {
            Metric::MbPerS => "mb_per_s",
            Metric::Iops => "iops",
            Metric::AvgLat => "lat_avg_us",
            Metric::P99Lat => "lat_p99_us",
        }
    }

    fn axis(self) -> &'static str {
        match self {
            Metric::MbPerS => "MB/s (10^6 bytes per second)",
            Metric::Iops => "IOPS",
            Metric::AvgLat => "average latency, µs",
            Metric::P99Lat => "p99 latency, µs",
        }
    }
}

/// One configuration: its name and a value per pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub values: Vec<(String, f64)>,
}

impl Series {
    /// The series of a `lanes bench --json` document (its "label", else `fallback`).
    pub fn from_json(doc: &Value, fallback: &str, metric: Metric) -> anyhow::Result<Series> {
        let results = doc
            .get("results")
            .and_then(Value::as_array)
            .context("no \"results\" array (not a lanes bench --json file?)")?;
        let mut values = Vec::with_capacity(results.len());
        for r in results {
            let name = r.get("pattern").and_then(Value::as_str);
            let v = r.get(metric.key()).and_then(Value::as_f64);
            match (name, v) {
                (Some(n), Some(v)) if v.is_finite() && v >= 0.0 => values.push((n.to_string(), v)),
                _ => bail!(
                    "a result without \"pattern\" and a numeric \"{}\"",
                    metric.key()
                ),
            }
        }
        let label = doc
            .get("label")
            .and_then(Value::as_str)
            .filter(|l| !l.is_empty())
            .unwrap_or(fallback)
            .to_string();
        Ok(Series { label, values })
    }
}

/// Loads the font once and registers it with plotters; a clear error when it is missing.
pub fn font() -> anyhow::Result<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = std::env::var_os("LANES_CHART_FONT")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_FONT));
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "charts need a TrueType font: {}: {e} (install Debian's fonts-dejavu-core, or \
                 set LANES_CHART_FONT to a .ttf file)",
                path.display()
            )
        })?;
        // plotters keeps fonts for the life of the process; this is loaded once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FAMILY, FontStyle::Normal, bytes)
            .map_err(|_| format!("{}: not a TrueType/OpenType font", path.display()))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// Distinct, print-friendly colours (Tableau 10), one per series.
const COLOURS: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

fn colour(i: usize) -> RGBColor {
    let (r, g, b) = COLOURS[i % COLOURS.len()];
    RGBColor(r, g, b)
}

/// Draws grouped bars: x = the patterns (in the seeds' order), one bar per series.
pub fn draw(
    out: &Path,
    title: &str,
    metric: Metric,
    series: &[Series],
    (width, height): (u32, u32),
) -> anyhow::Result<()> {
    font()?;
    if !(320..=8000).contains(&width) || !(240..=8000).contains(&height) {
        bail!("chart size {width}x{height}: width must be 320..=8000, height 240..=8000");
    }
    let mut patterns: Vec<&str> = Vec::new();
    for s in series {
        for (p, _) in &s.values {
            if !patterns.contains(&p.as_str()) {
                patterns.push(p);
            }
        }
    }
    patterns.sort_by_key(|p| pattern::order(p));
    if patterns.is_empty() {
        bail!("nothing to chart: the inputs hold no results");
    }
    let n = patterns.len();
    let top = series
        .iter()
        .flat_map(|s| s.values.iter().map(|(_, v)| *v))
        .fold(0.0f64, f64::max);
    // Headroom above the tallest bar for its value and the legend's rows.
    let top = if top > 0.0 {
        top * (1.1 + 0.06 * series.len() as f64)
    } else {
        1.0
    };
    let draw_err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing the chart: {e}");
    let root = BitMapBackend::new(out, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    // x counts thousandths of a pattern's group (integer coordinates, so plotters formats
    // the key points, one per group centre, with our names).
    const GROUP: i32 = 1000;
    let centers: Vec<i32> = (0..n as i32).map(|i| i * GROUP + GROUP / 2).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 26))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(90)
        .build_cartesian_2d((0..n as i32 * GROUP).with_key_points(centers), 0f64..top)
        .map_err(draw_err)?;
    let name_at = |x: &i32| {
        patterns
            .get((x / GROUP).max(0) as usize)
            .map_or(String::new(), |p| p.to_string())
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_max_light_lines(1)
        .x_label_formatter(&name_at)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_desc("pattern")
        .y_desc(metric.axis())
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .draw()
        .map_err(draw_err)?;
    // Bars take 80 % of a group; value labels only where a bar is wide enough to carry one.
    let bar = GROUP * 8 / 10 / series.len().max(1) as i32;
    let plot_width = f64::from(width.saturating_sub(140));
    let label_values = f64::from(bar) / f64::from(GROUP) * plot_width / n as f64 >= 34.0;
    let x_of = |p: &str, j: usize| {
        let i = patterns.iter().position(|q| *q == p)? as i32;
        Some(i * GROUP + GROUP / 10 + j as i32 * bar)
    };
    for (j, s) in series.iter().enumerate() {
        let c = colour(j);
        let bars = s.values.iter().filter_map(|(p, v)| {
            let x0 = x_of(p, j)?;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + bar * 92 / 100, *v)],
                c.filled(),
            ))
        });
        chart
            .draw_series(bars)
            .map_err(draw_err)?
            .label(s.label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 7), (x + 16, y + 7)], c.filled()));
        if label_values {
            let texts = s.values.iter().filter_map(|(p, v)| {
                let x = x_of(p, j)? + bar * 46 / 100;
                let style = TextStyle::from((FAMILY, 13).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Bottom));
                Some(Text::new(format!("{v:.0}"), (x, *v), style))
            });
            chart.draw_series(texts).map_err(draw_err)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FAMILY, 16))
        .draw()
        .map_err(draw_err)?;
    root.present()
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    Ok(())
}

/// `lanes bench chart OUT.png IN.json...`
pub fn run(args: ChartArgs) -> anyhow::Result<()> {
    let mut series = Vec::with_capacity(args.inputs.len());
    for path in &args.inputs {
        let shown = path.display();
        let text = std::fs::read(path).with_context(|| format!("reading {shown}"))?;
        let doc: Value =
            serde_json::from_slice(&text).with_context(|| format!("{shown}: not JSON"))?;
        let fallback = path
            .file_stem()
            .map_or_else(|| shown.to_string(), |s| s.to_string_lossy().into_owned());
        series.push(
            Series::from_json(&doc, &fallback, args.metric).with_context(|| shown.to_string())?,
        );
    }
    let title = args
        .title
        .unwrap_or_else(|| format!("lanes bench: {}", metric_title(args.metric)));
    draw(
        &args.out,
        &title,
        args.metric,
        &series,
        (args.width, args.height),
    )
}

pub fn metric_title(metric: Metric) -> &'static str {
    match metric {
        Metric::MbPerS => "throughput per pattern",
        Metric::Iops => "IOPS per pattern",
        Metric::AvgLat => "average latency per pattern",
        Metric::P99Lat => "p99 latency per pattern",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn series_from_bench_json() {
        let doc = json!({"label": "lanes 1 path", "results": [
            {"pattern": "64k-seqread", "mb_per_s": 119.5, "iops": 1823.0},
            {"pattern": "1m-seqread-qd1", "mb_per_s": 119.6, "iops": 114.0},
        ]});
        let s = Series::from_json(&doc, "file", Metric::MbPerS).unwrap();
        assert_eq!(s.label, "lanes 1 path");
        assert_eq!(s.values[1], ("1m-seqread-qd1".to_string(), 119.6));
        let s = Series::from_json(&json!({"results": []}), "file", Metric::Iops).unwrap();
        assert_eq!(s.label, "file");
        assert!(Series::from_json(&json!({"x": 1}), "f", Metric::Iops).is_err());
        let bad = json!({"results": [{"pattern": "x"}]});
        assert!(Series::from_json(&bad, "f", Metric::Iops).is_err());
    }
}
