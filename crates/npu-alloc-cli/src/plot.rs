//! `replay --plot`: allocated, reserved and active bytes over a trace's operations, one set of
//! curves per configuration, drawn as SVG with plotters.

use std::path::Path;

use alloc_trace::Point;
use plotters::prelude::*;

/// One configuration's curves and its label in the legend.
pub(crate) struct Curves<'a> {
    pub(crate) label: &'a str,
    pub(crate) points: &'a [Point],
}

/// Failure to draw the plot.
#[derive(Debug)]
pub(crate) struct PlotError(String);

impl std::fmt::Display for PlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for PlotError {
    fn from(e: DrawingAreaErrorKind<E>) -> Self {
        PlotError(e.to_string())
    }
}

/// One curve of a configuration: its name, its value at a point and its line width.
struct Series {
    name: &'static str,
    value: fn(&Point) -> i64,
    width: u32,
}

const SERIES: [Series; 3] = [
    Series {
        name: "reserved",
        value: |p| p.reserved,
        width: 3,
    },
    Series {
        name: "allocated",
        value: |p| p.allocated,
        width: 2,
    },
    Series {
        name: "active",
        value: |p| p.active,
        width: 1,
    },
];

/// The unit the y axis is drawn in, and its divisor, for the largest value.
fn unit(max: i64) -> (&'static str, f64) {
    const UNITS: [(&str, f64); 4] = [
        ("GiB", (1u64 << 30) as f64),
        ("MiB", (1u64 << 20) as f64),
        ("KiB", 1024.0),
        ("bytes", 1.0),
    ];
    UNITS
        .into_iter()
        .find(|&(_, d)| max as f64 >= d)
        .unwrap_or(UNITS[3])
}

/// Draws `runs` into an SVG file at `path`, titled `title`.
pub(crate) fn draw(path: &Path, title: &str, runs: &[Curves<'_>]) -> Result<(), PlotError> {
    let last_op = runs
        .iter()
        .filter_map(|r| r.points.last().map(|p| p.op))
        .max()
        .unwrap_or(0)
        .max(1);
    let max = runs
        .iter()
        .flat_map(|r| r.points.iter())
        .map(|p| p.reserved.max(p.allocated).max(p.active))
        .max()
        .unwrap_or(0);
    let (unit_name, divisor) = unit(max);
    let top = (max as f64 / divisor * 1.05).max(1.0);
    let root = SVGBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0u64..last_op, 0f64..top)
        .map_err(PlotError::from)?;
    chart
        .configure_mesh()
        .x_desc("operation")
        .y_desc(unit_name)
        .draw()?;
    let palette = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (i, run) in runs.iter().enumerate() {
        for (k, &Series { name, value, width }) in SERIES.iter().enumerate() {
            // One config: a colour per curve. Several: a colour per config, a width per curve.
            let colour = if runs.len() == 1 {
                palette[k]
            } else {
                palette[i % palette.len()]
            };
            let style = ShapeStyle {
                color: colour.mix(if width == 3 || runs.len() == 1 {
                    1.0
                } else {
                    0.6
                }),
                filled: false,
                stroke_width: width,
            };
            let label = if runs.len() > 1 {
                format!("{name}: {}", run.label)
            } else {
                name.to_owned()
            };
            chart
                .draw_series(LineSeries::new(
                    run.points.iter().map(|p| (p.op, value(p) as f64 / divisor)),
                    style,
                ))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
