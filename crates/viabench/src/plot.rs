//! Latency and throughput against block size, log scales, one curve per
//! test: SVG, or PNG through plotters' bitmap backend.  Text is set in
//! DejaVu Sans, which the binary carries, so no system font is needed.

use crate::error::{Error, Result};
use crate::report::TestResult;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (1100, 1000);

fn fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    });
}

/// Draws the plot into `path`; the extension (`.svg` or `.png`) picks the
/// format.
pub fn plot(path: &Path, title: &str, tests: &[TestResult]) -> Result<()> {
    fonts();
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "svg" => draw(SVGBackend::new(path, SIZE).into_drawing_area(), title, tests),
        "png" => draw(BitMapBackend::new(path, SIZE).into_drawing_area(), title, tests),
        _ => Err(Error::new(format!("{}: the plot must be .svg or .png", path.display()))),
    }
}

fn err<E: std::fmt::Debug>(e: E) -> Error {
    Error::new(format!("plot: {e:?}"))
}

/// The range of `values` widened to whole decades, for a log axis.
fn decades(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return 0.1..10.0;
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
    lo..hi
}

/// One chart: where, caption, unit, the value of a row.
type Panel<'a, DB> = (&'a DrawingArea<DB, Shift>, &'a str, &'a str, fn(&crate::report::Row) -> f64);

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, tests: &[TestResult]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 24)).map_err(err)?;
    let (upper, lower) = root.split_vertically(SIZE.1 / 2 - 20);
    let bytes = decades(tests.iter().flat_map(|t| t.rows.iter().map(|r| r.bytes as f64)));
    let panels: [Panel<'_, DB>; 2] = [
        (&upper, "One-way latency", "µs", |r| r.one_way_us),
        (&lower, "Throughput", "MB/s (10^6 bytes/s)", |r| r.mb_per_s),
    ];
    for (area, caption, unit, value) in panels {
        let ys = decades(tests.iter().flat_map(|t| t.rows.iter().map(value)));
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(bytes.clone().log_scale(), ys.log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("block size (bytes)")
            .y_desc(unit)
            .x_label_formatter(&|x| human_bytes(*x))
            .y_label_formatter(&|y| format!("{y}"))
            .draw()
            .map_err(err)?;
        for (i, t) in tests.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> =
                t.rows.iter().map(|r| (r.bytes as f64, value(r))).filter(|p| p.1 > 0.0).collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(err)?
                .label(t.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Axis labels of block sizes, which fall on decades: `1`, `100`, `10k`,
/// `1M`.
pub fn human_bytes(x: f64) -> String {
    let (v, unit) = if x >= 1e6 {
        (x / 1e6, "M")
    } else if x >= 1e3 {
        (x / 1e3, "k")
    } else {
        (x, "")
    };
    let v = (v * 1000.0).round() / 1000.0;
    format!("{v}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::LinkStats;
    use crate::proto::{Mode, Pattern, Reliability, TestSpec, Wait};
    use crate::report::Row;

    fn result(label: &str, scale: f64) -> TestResult {
        TestResult {
            label: label.into(),
            spec: TestSpec {
                mode: Mode::Tcp,
                pattern: Pattern::PingPong,
                wait: Wait::Poll,
                vis: None,
                device: "/dev/via_lo".into(),
                reliability: Reliability::Delivery,
                segment: None,
                sockbuf: None,
                max_block: 1 << 20,
                desc_size: 1 << 20,
                ring: 16,
                tag: "t".into(),
                timeout_ms: 1000,
            },
            rows: [1usize, 4, 1024, 65536, 1 << 20]
                .iter()
                .map(|&b| Row::new(b, scale * (1e-6 + b as f64 / 5e9), 10, 1, true))
                .collect(),
            error: None,
            stats: LinkStats::default(),
            connect: None,
        }
    }

    #[test]
    fn decades_cover_the_values() {
        assert_eq!(decades([3.0, 450.0].into_iter()), 1.0..1000.0);
        assert_eq!(decades([0.0].into_iter()), 0.1..10.0);
        assert_eq!(decades([10.0].into_iter()), 10.0..100.0);
        assert_eq!(human_bytes(10000.0), "10k");
        assert_eq!(human_bytes(1e6), "1M");
        assert_eq!(human_bytes(100.0), "100");
        assert_eq!(human_bytes(4096.0), "4.096k");
    }

    #[test]
    fn svg_and_png_are_written() {
        let dir = std::env::temp_dir().join(format!("viabench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tests = [result("via-send/pingpong/poll", 1.0), result("tcp/pingpong/poll", 5.0)];
        let svg = dir.join("p.svg");
        plot(&svg, "test", &tests).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg") && text.contains("tcp/pingpong/poll"));
        let png = dir.join("p.png");
        plot(&png, "test", &tests).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(plot(&dir.join("p.gif"), "test", &tests).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
