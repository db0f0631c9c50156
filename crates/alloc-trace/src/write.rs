//! Writing a [`Trace`] as `.trace` text that parses back to the same directives and operations:
//! how a stress failure is printed so that `replay --check` re-runs it.

use std::fmt::{self, Write};

use alloc_sim::Fault;

use crate::op::{Misuse, OpKind, PoolOp, Trace};

/// One operation as its `.trace` line (without the newline), ids by their names in `trace`.
pub struct Line<'a> {
    trace: &'a Trace,
    kind: &'a OpKind,
}

impl<'a> Line<'a> {
    /// The line of `kind`, an operation of `trace`.
    pub fn new(trace: &'a Trace, kind: &'a OpKind) -> Self {
        Line { trace, kind }
    }
}

impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |id| self.trace.id_name(id);
        let keyword = self.kind.keyword();
        match *self.kind {
            OpKind::Alloc { id, size, stream } => {
                write!(f, "{keyword} {} {size} {stream}", name(id))
            }
            OpKind::Free { id } => write!(f, "{keyword} {}", name(id)),
            OpKind::Record { id, stream } => write!(f, "{keyword} {} {stream}", name(id)),
            OpKind::Complete { stream: Some(s) } => write!(f, "{keyword} {s}"),
            OpKind::Fraction(x) => write!(f, "{keyword} {x}"),
            OpKind::Settings(ref settings) => write!(f, "{keyword} {settings}"),
            OpKind::Pool(PoolOp::Create {
                ref name,
                use_on_oom,
                no_split,
            }) => {
                write!(f, "{keyword} {name}")?;
                if use_on_oom {
                    f.write_str(" use_on_oom")?;
                }
                if no_split {
                    f.write_str(" no_split")?;
                }
                Ok(())
            }
            OpKind::Pool(PoolOp::Use(ref name) | PoolOp::Release(ref name)) => {
                write!(f, "{keyword} {name}")
            }
            OpKind::Region {
                ref tag,
                cpu_backup,
            } => {
                if cpu_backup {
                    write!(f, "{keyword} {tag} cpu_backup")
                } else {
                    write!(f, "{keyword} {tag}")
                }
            }
            OpKind::Pause(Some(ref tag)) | OpKind::Resume(Some(ref tag)) => {
                write!(f, "{keyword} {tag}")
            }
            OpKind::RetainCpuBackup(retain) => {
                write!(f, "{keyword} {}", if retain { "on" } else { "off" })
            }
            OpKind::MemoryMargin(bytes) => write!(f, "{keyword} {bytes}"),
            OpKind::Fill { id, byte } | OpKind::Expect { id, byte } => {
                write!(f, "{keyword} {} {byte}", name(id))
            }
            OpKind::Stats { label: Some(ref l) } => write!(f, "{keyword} {l}"),
            OpKind::Fault { call, nth, fault } => match fault {
                Fault::OutOfMemory => write!(f, "{keyword} {call} {nth} oom"),
                Fault::Error(code) => write!(f, "{keyword} {call} {nth} error {code}"),
            },
            OpKind::Misuse(m) => match m {
                Misuse::DoubleFree { id } | Misuse::InteriorPointer { id } => {
                    write!(f, "{keyword} {}", name(id))
                }
                Misuse::RecordFreed { id, stream } => {
                    write!(f, "{keyword} {} {stream}", name(id))
                }
                Misuse::ForeignPointer { addr } => write!(f, "{keyword} {addr:#x}"),
            },
            OpKind::Complete { stream: None }
            | OpKind::Stats { label: None }
            | OpKind::EmptyCache { .. }
            | OpKind::ResetPeak
            | OpKind::ResetAccumulated
            | OpKind::Pool(PoolOp::End)
            | OpKind::EndRegion
            | OpKind::Pause(None)
            | OpKind::Resume(None)
            | OpKind::Drain => f.write_str(keyword),
        }
    }
}

/// The whole trace as text: its directives, then one line per operation.
pub fn to_text(trace: &Trace) -> String {
    let mut out = String::new();
    if let Some(c) = trace.capacity {
        let _ = writeln!(out, "capacity {c}");
    }
    if let Some(o) = trace.device_overhead {
        let _ = writeln!(out, "device_overhead {o}");
    }
    if let Some(p) = trace.pad {
        let _ = writeln!(out, "pad {p}");
    }
    if let Some(f) = trace.flavour {
        let _ = writeln!(out, "flavour {}", crate::op::flavour_name(f));
    }
    if let Some(conf) = trace
        .conf
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty())
    {
        let _ = writeln!(out, "conf {conf}");
    }
    for op in &trace.ops {
        let _ = writeln!(out, "{}", Line::new(trace, &op.kind));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_str;
    use alloc_sim::DeviceCall;

    #[test]
    fn every_operation_writes_a_line_that_parses_back() {
        let text = "capacity 1073741824\ndevice_overhead 1024\npad 0\nflavour cuda\n\
                    conf max_split_size_mb:40\n\
                    alloc a 4096 0\nalloc b 0 2\nrecord a 1\ncomplete 1\ncomplete\nempty_cache\n\
                    fraction 1\nfraction 0.25\nreset_peak\nreset_accumulated\nstats\nstats mid\n\
                    fault malloc 2 oom\nfault free 1 error 5\nfree_interior a\nfree a\n\
                    double_free a\nrecord_freed a 3\nfree_foreign 0xdead0000\ndrain\n";
        let trace = parse_str("t.trace", text).unwrap();
        assert_eq!(to_text(&trace), text);
        let again = parse_str("t.trace", &to_text(&trace)).unwrap();
        assert_eq!(again.ops, trace.ops);
        assert!(matches!(
            again.ops[12].kind,
            OpKind::Fault {
                call: DeviceCall::Malloc,
                nth: 2,
                fault: Fault::OutOfMemory
            }
        ));
    }
}
