//! `memory_summary()`: torch_npu's readable table of one device's stats
//! (`torch_npu/npu/memory.py`: its names, units and spacing, which differ from PyTorch's).

use core::fmt::Write;

use alloc_core::{DeviceStats, Stat, StatArray};

/// Width of a line between the outer `|`s.
const WIDTH: usize = 75;

/// A cell formatter: a value and the row's reference value (its `all` row) choose the unit.
type Formatter = fn(i64, i64) -> String;

/// torch_npu's `_format_size`: bytes divided by 1024 while the reference is at least
/// 768 × 1024 of the current unit, with its units (`KB`, not PyTorch's `KiB`) and width.
fn format_size(mut size: i64, reference: i64) -> String {
    const PREFIXES: [&str; 6] = ["B ", "KB", "MB", "GB", "TB", "PB"];
    let mut prefix = PREFIXES[0];
    let mut reference = reference as f64;
    for p in &PREFIXES[1..] {
        if reference < 768.0 * 1024.0 {
            break;
        }
        prefix = p;
        size = size.div_euclid(1024); // Python's `//` floors
        reference /= 1024.0;
    }
    format!("{size:7} {prefix}")
}

/// torch's `_format_count`: counts, scaled by 1000 while the reference is ≥ 750 000.
fn format_count(mut count: i64, reference: i64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    let mut prefix = PREFIXES[0];
    let mut reference = reference as f64;
    for p in &PREFIXES[1..] {
        if reference < 750.0 * 1000.0 {
            break;
        }
        prefix = p;
        count = count.div_euclid(1000);
        reference /= 1000.0;
    }
    format!("{count:7} {prefix} ")
}

/// One table row: name, then current, peak, allocated and freed, each scaled by `reference`.
fn row(out: &mut Vec<String>, name: &str, stat: &Stat, reference: &Stat, format: Formatter) {
    out.push(format!(
        " {name:<21} | {} | {} | {} | {} ",
        format(stat.current, reference.current),
        format(stat.peak, reference.peak),
        format(stat.allocated, reference.allocated),
        format(stat.freed, reference.freed),
    ));
}

/// What a device's expandable segments hold, for the summary: torch's segment rows count device
/// segments only, so the summary says what the mapped ranges are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpandableSummary {
    /// Contiguous mapped ranges (the snapshot's expandable segments).
    pub mapped_ranges: usize,
    /// Bytes mapped.
    pub mapped_bytes: u64,
    /// Reserved virtual address ranges.
    pub reserved_ranges: usize,
    /// Bytes of virtual address space reserved.
    pub reserved_bytes: u64,
}

/// torch_npu's `memory_summary(device, abbreviated)` text for `stats`: a 77-column table, each
/// line ending in a newline. With expandable segments, two lines after the oversize rows say
/// what they hold (the rest is torch_npu's table unchanged; docs/deviations.md).
pub fn memory_summary(
    device: u32,
    stats: &DeviceStats,
    abbreviated: bool,
    expandable: ExpandableSummary,
) -> String {
    // torch_npu's rows: PyTorch's "Requested memory" row is not among them.
    let arrays: [(&StatArray, &str, Formatter); 8] = [
        (&stats.allocated_bytes, "Allocated memory", format_size),
        (&stats.active_bytes, "Active memory", format_size),
        (&stats.reserved_bytes, "NPU reserved memory", format_size),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            format_size,
        ),
        (&stats.allocation, "Allocations", format_count),
        (&stats.active, "Active allocs", format_count),
        (&stats.segment, "NPU reserved segments", format_count),
        (&stats.inactive_split, "Non-releasable allocs", format_count),
    ];
    // Read through torch's int64 stats, as `DeviceStats::flat` reports them.
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mut lines = vec![
        "=".repeat(WIDTH),
        format!(
            " {:16} PyTorch NPU memory summary, device ID {device:<18} ",
            ""
        ),
        "-".repeat(WIDTH),
        format!(
            "  {:9} NPU OOMs: {:<13} | {:6} npuMalloc retries: {:<9}  ",
            "",
            count(stats.num_ooms),
            "",
            count(stats.num_alloc_retries)
        ),
        "=".repeat(WIDTH),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_owned(),
    ];
    for (array, name, format) in arrays {
        lines.push("-".repeat(WIDTH));
        row(&mut lines, name, &array.all, &array.all, format);
        if !abbreviated {
            row(
                &mut lines,
                "      from large pool",
                &array.large_pool,
                &array.all,
                format,
            );
            row(
                &mut lines,
                "      from small pool",
                &array.small_pool,
                &array.all,
                format,
            );
        }
    }
    for (stat, name) in [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize NPU segments"),
    ] {
        lines.push("-".repeat(WIDTH));
        row(&mut lines, name, stat, stat, format_count);
    }
    if expandable.reserved_ranges > 0 {
        let size = |b: u64| alloc_core::FormatSize(b).to_string();
        lines.push("-".repeat(WIDTH));
        lines.push(format!(
            " {:<wide$}",
            format!(
                "Expandable segments: {} mapped ranges, {} mapped",
                expandable.mapped_ranges,
                size(expandable.mapped_bytes)
            ),
            wide = WIDTH - 1
        ));
        lines.push(format!(
            " {:<wide$}",
            format!(
                "  in {} reserved address ranges of {}",
                expandable.reserved_ranges,
                size(expandable.reserved_bytes)
            ),
            wide = WIDTH - 1
        ));
    }
    lines.push("=".repeat(WIDTH));
    let mut out = String::new();
    for line in lines {
        let _ = writeln!(out, "|{line}|");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc_core::PoolKind;

    #[test]
    fn units_follow_torch() {
        // torch_npu's `_format_size`: "{:7d} {}" with "B ", "KB", "MB", ...
        assert_eq!(format_size(0, 0), "      0 B ");
        assert_eq!(format_size(1024, 1024), "   1024 B ");
        assert_eq!(format_size(786_432, 786_432), "    768 KB");
        assert_eq!(format_size(20 << 20, 20 << 20), "  20480 KB");
        assert_eq!(format_size(1 << 30, 1 << 30), "   1024 MB");
        // A pool row is scaled by its `all` row.
        assert_eq!(format_size(1024, 1 << 30), "      0 MB");
        assert_eq!(format_count(3, 3), "      3   ");
        assert_eq!(format_count(750_000, 750_000), "    750 K ");
        // A negative value (a wrapped stat) floors, as Python's `//` does.
        assert_eq!(format_size(-1, 1 << 30), "     -1 MB");
        assert_eq!(format_count(-1, 750_000), "     -1 K ");
    }

    #[test]
    fn table_shape_and_values() {
        let mut stats = DeviceStats::default();
        stats.allocated_bytes.increase(PoolKind::Small, 1024);
        stats.reserved_bytes.increase(PoolKind::Small, 2 << 20);
        stats.allocation.increase(PoolKind::Small, 1);
        stats.num_ooms = 2;
        let text = memory_summary(3, &stats, false, ExpandableSummary::default());
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines.iter().all(|l| l.chars().count() == WIDTH + 2),
            "{text}"
        );
        // The header, 8 metrics of a dashed line and 3 rows, 2 oversize rows each after a
        // dashed line, the closing line.
        assert_eq!(lines.len(), 6 + 8 * 4 + 2 * 2 + 1);
        assert_eq!(
            lines[3],
            "|            NPU OOMs: 2             |        npuMalloc retries: 0          |"
        );
        assert!(lines[1].contains("PyTorch NPU memory summary, device ID 3 "));
        // Counters read as torch's int64 (`flat`'s cap), as torch_npu's `{:<13d}` prints them.
        let huge = DeviceStats {
            num_ooms: u64::MAX,
            ..DeviceStats::default()
        };
        let huge = memory_summary(0, &huge, true, ExpandableSummary::default());
        assert!(huge.contains("NPU OOMs: 9223372036854775807 |"), "{huge}");
        assert!(lines[3].contains("NPU OOMs: 2 "));
        assert!(lines[3].contains("npuMalloc retries: 0 "));
        assert_eq!(
            lines[7],
            "| Allocated memory      |    1024 B  |    1024 B  |    1024 B  |       0 B  |"
        );
        assert_eq!(
            lines[9],
            "|       from small pool |    1024 B  |    1024 B  |    1024 B  |       0 B  |"
        );
        assert!(
            text.contains(
                "| NPU reserved memory   |    2048 KB |    2048 KB |    2048 KB |       0 B  |"
            ),
            "{text}"
        );
        let short = memory_summary(0, &stats, true, ExpandableSummary::default());
        assert_eq!(short.lines().count(), 6 + 8 * 2 + 2 * 2 + 1);
        let with = memory_summary(
            0,
            &stats,
            true,
            ExpandableSummary {
                mapped_ranges: 2,
                mapped_bytes: 60 << 20,
                reserved_ranges: 1,
                reserved_bytes: 1160 << 20,
            },
        );
        let lines: Vec<&str> = with.lines().collect();
        assert_eq!(lines.len(), 6 + 8 * 2 + 2 * 2 + 1 + 3);
        assert!(lines.iter().all(|l| l.chars().count() == WIDTH + 2));
        assert_eq!(
            lines[lines.len() - 3],
            format!(
                "| {:<74}|",
                "Expandable segments: 2 mapped ranges, 60.00 MiB mapped"
            )
        );
        assert_eq!(
            lines[lines.len() - 2],
            format!("| {:<74}|", "  in 1 reserved address ranges of 1.13 GiB")
        );
    }
}
