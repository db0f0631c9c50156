//! Errors of the policy core, each with torch_npu's wording where users know it.

use alloc::boxed::Box;
use alloc::string::String;
use core::fmt;

use crate::private_pool::PoolError;

/// Formats a byte count as torch's `format_size` does ("N bytes", then KiB, MiB, GiB with two
/// decimals).
pub struct FormatSize(pub u64);

impl fmt::Display for FormatSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let x = n as f64;
        if n <= 1024 {
            write!(f, "{n} bytes")
        } else if n <= 1 << 20 {
            write!(f, "{:.2} KiB", x / 1024.0)
        } else if n <= 1 << 30 {
            write!(f, "{:.2} MiB", x / (1u64 << 20) as f64)
        } else {
            write!(f, "{:.2} GiB", x / (1u64 << 30) as f64)
        }
    }
}

/// An out-of-memory failure with the numbers torch_npu prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Device index.
    pub device: u32,
    /// The size the caller asked for.
    pub requested: u64,
    /// The segment size the allocator tried to get (what torch reports as "Tried to allocate").
    pub alloc_size: u64,
    /// Total device memory, when the device reports it.
    pub total: Option<u64>,
    /// Free device memory at the time of the failure, when the device reports it.
    pub free: Option<u64>,
    /// Bytes allocated to callers (`allocated_bytes.all.current`).
    pub allocated: u64,
    /// Bytes of active blocks (`active_bytes.all.current`).
    pub active: u64,
    /// Bytes reserved in segments (`reserved_bytes.all.current`).
    pub reserved: u64,
    /// The per-process limit, when a fraction below 1 is set.
    pub allowed: Option<u64>,
}

struct Maybe(Option<u64>);

impl fmt::Display for Maybe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => FormatSize(n).fmt(f),
            None => f.write_str("unknown"),
        }
    }
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NPU out of memory. Tried to allocate {} (NPU {}; {} total capacity; {} already allocated; \
             {} current active; {} free; ",
            FormatSize(self.alloc_size),
            self.device,
            Maybe(self.total),
            FormatSize(self.allocated),
            FormatSize(self.active),
            Maybe(self.free),
        )?;
        if let Some(allowed) = self.allowed {
            write!(f, "{} allowed; ", FormatSize(allowed))?;
        }
        write!(
            f,
            "{} reserved in total by PyTorch).If reserved memory is >> allocated memory try setting \
             max_split_size_mb to avoid fragmentation.",
            FormatSize(self.reserved)
        )
    }
}

/// A segment refused by `throw_on_npumalloc_oom` before the device was asked (torch_npu's
/// `OomRejectionInfo`): the malloc failed at once, with no retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// Device index.
    pub device: u32,
    /// The size the caller asked for (what torch_npu's message names).
    pub requested: u64,
    /// The segment size that was refused (torch_npu's `alloc_size` of the observers).
    pub alloc_size: u64,
    /// Bytes of every segment before the request (torch's `total_allocated_memory`).
    pub total_allocated: u64,
    /// `per_process_memory_fraction` of the device's total: the bound it would have passed.
    pub limit: u64,
    /// The device's total memory, as reported for the check.
    pub device_total: u64,
}

impl Rejection {
    /// torch_npu's warn-once text for the first rejection (`Notice::OomRejection`). The
    /// percentage is the limit's share of the device's total, printed as C++ prints the
    /// configured fraction × 100 (six significant digits): the two differ by less than a byte's
    /// share.
    pub(crate) fn fmt_warning(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let percent = if self.device_total == 0 {
            0.0
        } else {
            self.limit as f64 * 100.0 / self.device_total as f64
        };
        write!(
            f,
            "Preemptively rejecting allocation of {} on NPU {}: total_allocated_memory ({}) + \
             requested size would exceed memory limit ({} = ",
            FormatSize(self.alloc_size),
            self.device,
            FormatSize(self.total_allocated),
            FormatSize(self.limit),
        )?;
        write_six_significant(f, percent)?;
        write!(
            f,
            "% of {}). Set throw_on_npumalloc_oom:False to disable this behavior.",
            FormatSize(self.device_total)
        )
    }
}

/// `x` (0 to 100) as C++'s `ostream` writes a double by default (`%g`, precision 6): six
/// significant digits, trailing zeros and a bare point dropped, and below 1e-4 in exponent form
/// (`1.5e-05`).
fn write_six_significant(f: &mut fmt::Formatter<'_>, x: f64) -> fmt::Result {
    // Rounded to six significant digits first: `%g` picks its form by the rounded exponent.
    let rounded = alloc::format!("{x:.5e}");
    let (mantissa, exponent) = rounded.split_once('e').unwrap_or((&rounded, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let trim = |text: &str| -> alloc::string::String {
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').into()
        } else {
            text.into()
        }
    };
    if x != 0.0 && !(-4..6).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return write!(f, "{}e{sign}{:02}", trim(mantissa), exponent.unsigned_abs());
    }
    let decimals = usize::try_from(5 - exponent).unwrap_or(0);
    f.write_str(&trim(&alloc::format!("{x:.decimals$}")))
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NPU out of memory. Allocation was preemptively rejected because it would exceed \
             per_process_memory_fraction limit. Requested size: {}",
            FormatSize(self.requested)
        )
    }
}

/// A failed `malloc`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError<E> {
    /// No memory after torch's whole retry chain. Boxed: the report is large, and every
    /// `malloc` result is as large as its largest error.
    OutOfMemory(Box<OutOfMemory>),
    /// With `throw_on_npumalloc_oom:True`, a segment that would take every segment's bytes past
    /// `per_process_memory_fraction` of the device's total: refused with no retry, counted in
    /// `num_oom_rejections` (not `num_ooms`). Out of memory to torch_npu's callers.
    Rejected(Box<Rejection>),
    /// A request of 1 EiB or more, refused before the allocator runs.
    TooLarge {
        /// The requested size.
        size: u64,
    },
    /// A device failure other than out-of-memory, passed through unchanged.
    Device(E),
    /// The request named a private pool that cannot take allocations.
    Pool(PoolError),
    /// The request was routed to a memory-saver tag that is paused: its memory is not backed
    /// until `resume`, so nothing is handed out from it.
    Paused {
        /// The tag.
        tag: String,
    },
}

impl<E> From<PoolError> for AllocError<E> {
    fn from(e: PoolError) -> Self {
        AllocError::Pool(e)
    }
}

impl<E: fmt::Display> fmt::Display for AllocError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory(oom) => oom.fmt(f),
            AllocError::Rejected(r) => r.fmt(f),
            AllocError::TooLarge { .. } => {
                f.write_str("NPU out of memory. Tried to allocate more than 1EB memory.")
            }
            AllocError::Device(e) => write!(f, "NPU error: {e}"),
            AllocError::Pool(e) => e.fmt(f),
            AllocError::Paused { tag } => write!(
                f,
                "memory saver tag {tag:?} is paused: resume it before allocating in its region"
            ),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> core::error::Error for AllocError<E> {}

/// A failed `free` or `record_stream`; the allocator's state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FreeError<E> {
    /// The address lies in no segment of this allocator.
    ForeignPointer {
        /// The address given.
        addr: u64,
    },
    /// The address lies in a segment but is not a live allocation (a double free, a block whose
    /// free is pending, or an interior pointer).
    NotAllocated {
        /// The address given.
        addr: u64,
    },
    /// Recording the stream events failed and so did the device synchronization fallback.
    Device(E),
    /// With [`HostQueue::SyncFirst`](crate::HostQueue::SyncFirst): the allocation was used on
    /// other streams, and the host's queued work must reach the device before the events of its
    /// free are recorded. Nothing changed: drain the queue (without the allocator's lock), then
    /// call [`Allocator::free_after_drain`](crate::Allocator::free_after_drain).
    DrainFirst {
        /// The address given.
        addr: u64,
    },
}

impl<E: fmt::Display> fmt::Display for FreeError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FreeError::ForeignPointer { addr } => write!(f, "invalid device pointer: {addr:#x}"),
            FreeError::NotAllocated { addr } => write!(
                f,
                "invalid device pointer: {addr:#x} is not a live allocation (double free?)"
            ),
            FreeError::Device(e) => write!(f, "NPU error: {e}"),
            FreeError::DrainFirst { addr } => write!(
                f,
                "the free of {addr:#x}, used on other streams, waits for the host's queued work \
                 to be drained"
            ),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> core::error::Error for FreeError<E> {}

/// A rejected `set_per_process_memory_fraction`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum FractionError {
    /// The fraction is not within [0, 1].
    OutOfRange(f64),
    /// A limit below 1 needs the device's total memory, which the device does not report.
    TotalUnknown,
}

impl fmt::Display for FractionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FractionError::OutOfRange(v) => {
                write!(f, "Invalid fraction value: {v}. Allowed range: 0~1")
            }
            FractionError::TotalUnknown => f.write_str(
                "set_per_process_memory_fraction needs the device's total memory, which it does not report",
            ),
        }
    }
}

impl core::error::Error for FractionError {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn percentages_print_as_cpp_streams_a_double() {
        struct Pct(f64);
        impl fmt::Display for Pct {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_six_significant(f, self.0)
            }
        }
        let cases = [
            (80.0, "80"),
            (100.0 / 3.0, "33.3333"),
            (50.0 / 9.0, "5.55556"),
            (100.0, "100"),
            (0.5, "0.5"),
            (0.0123456789, "0.0123457"),
            (99.99999996, "100"),
            (0.0, "0"),
            // printf("%g") below 1e-4: the exponent form, two exponent digits at least.
            (0.0001, "0.0001"),
            (0.00001234567, "1.23457e-05"),
            (0.000099999996, "0.0001"),
            (5e-7, "5e-07"),
            (1.5e-123, "1.5e-123"),
        ];
        for (x, text) in cases {
            assert_eq!(Pct(x).to_string(), text, "{x}");
        }
    }

    #[test]
    fn format_size_boundaries() {
        assert_eq!(FormatSize(1024).to_string(), "1024 bytes");
        assert_eq!(FormatSize(1025).to_string(), "1.00 KiB");
        assert_eq!(FormatSize(1 << 20).to_string(), "1024.00 KiB");
        assert_eq!(FormatSize(20 << 20).to_string(), "20.00 MiB");
        assert_eq!(FormatSize(1 << 30).to_string(), "1024.00 MiB");
        assert_eq!(FormatSize(3 << 29).to_string(), "1.50 GiB");
    }

    #[test]
    fn oom_message_is_torch_npus() {
        let oom = OutOfMemory {
            device: 0,
            requested: 2 << 20,
            alloc_size: 20 << 20,
            total: Some(64 << 30),
            free: Some(10 << 20),
            allocated: 3 << 30,
            active: 3 << 30,
            reserved: 4 << 30,
            allowed: None,
        };
        assert_eq!(
            oom.to_string(),
            "NPU out of memory. Tried to allocate 20.00 MiB (NPU 0; 64.00 GiB total capacity; \
             3.00 GiB already allocated; 3.00 GiB current active; 10.00 MiB free; 4.00 GiB \
             reserved in total by PyTorch).If reserved memory is >> allocated memory try setting \
             max_split_size_mb to avoid fragmentation."
        );
        let limited = OutOfMemory {
            allowed: Some(32 << 30),
            ..oom
        };
        assert!(
            limited
                .to_string()
                .contains("10.00 MiB free; 32.00 GiB allowed; 4.00 GiB reserved")
        );
        let e: AllocError<&str> = AllocError::TooLarge { size: 1 << 60 };
        assert_eq!(
            e.to_string(),
            "NPU out of memory. Tried to allocate more than 1EB memory."
        );
    }
}
