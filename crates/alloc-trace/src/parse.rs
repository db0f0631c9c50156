//! The `.trace` parser: text in, a typed script of allocator operations out.
//!
//! The replayer must run millions of operations per second, so all text handling happens here,
//! once: every line is tokenized, sizes and streams are converted, and every allocation id is
//! interned into a dense [`IdRef`] (a `u32` index) so the executor can keep its live handles in a
//! `Vec`. The parser checks the syntax of every line; whether an id is live when a line names it
//! depends on the allocator (an `alloc` that ran out of memory leaves its id unallocated, a `free`
//! that hit an injected device error leaves it live), so the executor checks that.
//!
//! Lines end with `\n`; a `\r` before it is ignored, so files with CRLF line ends also parse.
//! Line numbers are 1-based. Beyond the format, a directive given twice is malformed too.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use alloc_core::Flavour;
use alloc_sim::{DeviceCall, Fault};

use crate::op::{IdRef, Misuse, Op, OpKind, PoolOp, Trace};
use crate::size::{SizeError, parse_size};

/// A malformed trace line: shown as `file:line: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// The file name given to the parser.
    pub file: String,
    /// The 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub kind: TraceErrorKind,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.kind)
    }
}

impl std::error::Error for TraceError {}

/// Text from the input as an error message shows it: control characters and the byte-order mark
/// escaped (`\0`, `\u{feff}`), and at most [`Echo::MAX`] characters, then `…` and the length, so
/// a 100,000-digit size gives a short line.
pub struct Echo<'a>(pub &'a str);

impl Echo<'_> {
    /// The most characters shown.
    pub const MAX: usize = 40;
}

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars().take(Echo::MAX) {
            if c.is_control() || c == '\u{feff}' {
                write!(f, "{}", c.escape_debug())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        let n = self.0.chars().count();
        if n > Echo::MAX {
            write!(f, "… ({n} characters)")?;
        }
        Ok(())
    }
}

/// Every way a trace line can be malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceErrorKind {
    /// The line is not valid UTF-8.
    NotUtf8,
    /// The file starts with a UTF-8 byte-order mark, which would read as part of a keyword.
    ByteOrderMark,
    /// The first token is not a keyword of the format (keywords are lower case).
    UnknownKeyword {
        /// The token found.
        keyword: String,
    },
    /// A required token is missing.
    MissingToken {
        /// The line's keyword.
        keyword: &'static str,
        /// What was expected, such as `<size>`.
        expected: &'static str,
    },
    /// The line has more tokens than its keyword takes.
    ExtraToken {
        /// The line's keyword.
        keyword: &'static str,
        /// The first token too many.
        token: String,
    },
    /// A size that does not parse, is not whole, or does not fit in 64 bits.
    BadSize {
        /// The token found.
        token: String,
        /// Why it was rejected.
        error: SizeError,
    },
    /// A stream that is not a non-negative integer.
    BadStream {
        /// The token found.
        token: String,
    },
    /// A stream that does not fit in 64 bits.
    StreamTooLarge {
        /// The token found.
        token: String,
    },
    /// A fraction that is not a number.
    BadFraction {
        /// The token found.
        token: String,
    },
    /// A fraction outside `[0, 1]` (or not finite).
    FractionOutOfRange {
        /// The token found.
        token: String,
    },
    /// A directive after the first operation.
    DirectiveAfterOperation {
        /// The directive.
        directive: &'static str,
        /// The line of the first operation.
        first_op_line: usize,
    },
    /// The same directive given twice.
    DuplicateDirective {
        /// The directive.
        directive: &'static str,
        /// The line where it was first given.
        first_line: usize,
    },
    /// A `flavour` other than `torch_npu` or `cuda`.
    UnknownFlavour {
        /// The token found.
        token: String,
    },
    /// An option word the keyword does not take (`region` takes `cpu_backup`, `pool` takes
    /// `use_on_oom` and `no_split`, each once).
    UnknownOption {
        /// The keyword.
        keyword: &'static str,
        /// The token found.
        token: String,
    },
    /// A `fault` line naming a call the simulated device does not have.
    UnknownCall {
        /// The token found.
        token: String,
    },
    /// A `fault` line whose kind is neither `oom` nor `error`.
    UnknownFault {
        /// The token found.
        token: String,
    },
    /// A number (a fault's call count or code, an address) that does not parse or fit.
    BadNumber {
        /// What the number is, such as `<code>`.
        what: &'static str,
        /// The token found.
        token: String,
        /// What would have been accepted, such as "an integer from 0 to 255".
        expected: &'static str,
    },
    /// More than 2^32 distinct ids.
    TooManyIds,
}

/// Every keyword of the format (directives and operations), for the "keywords are lower case"
/// hint and for tests that generate traces.
pub const KEYWORDS: [&str; 34] = [
    "capacity",
    "conf",
    "device_overhead",
    "pad",
    "flavour",
    "alloc",
    "free",
    "record",
    "complete",
    "empty_cache",
    "empty_virt_addr_cache",
    "fraction",
    "reset_peak",
    "reset_accumulated",
    "stats",
    "fault",
    "double_free",
    "record_freed",
    "free_foreign",
    "free_interior",
    "drain",
    "set_allocator_settings",
    "pool",
    "use_pool",
    "end_pool",
    "release_pool",
    "region",
    "end_region",
    "pause",
    "resume",
    "retain_cpu_backup",
    "memory_margin",
    "fill",
    "expect",
];

impl fmt::Display for TraceErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceErrorKind::NotUtf8 => f.write_str("line is not valid UTF-8"),
            TraceErrorKind::ByteOrderMark => f.write_str(
                "the file starts with a UTF-8 byte-order mark (U+FEFF); save it without one",
            ),
            TraceErrorKind::UnknownKeyword { keyword } => {
                write!(f, "unknown keyword `{}`", Echo(keyword))?;
                if KEYWORDS.contains(&keyword.to_lowercase().as_str()) {
                    f.write_str(" (keywords are lower case)")?;
                }
                Ok(())
            }
            TraceErrorKind::MissingToken { keyword, expected } => {
                write!(f, "`{keyword}` is missing {expected}")
            }
            TraceErrorKind::ExtraToken { keyword, token } => {
                write!(
                    f,
                    "extra token `{}` after `{keyword}` and its arguments",
                    Echo(token)
                )
            }
            TraceErrorKind::BadSize { token, error } => {
                write!(f, "bad size `{}`: {error}", Echo(token))
            }
            TraceErrorKind::BadStream { token } => {
                write!(
                    f,
                    "bad stream `{}`: expected a non-negative integer",
                    Echo(token)
                )
            }
            TraceErrorKind::StreamTooLarge { token } => {
                write!(f, "stream `{}` does not fit in 64 bits", Echo(token))
            }
            TraceErrorKind::BadFraction { token } => {
                write!(
                    f,
                    "bad fraction `{}`: expected a number in [0, 1]",
                    Echo(token)
                )
            }
            TraceErrorKind::FractionOutOfRange { token } => {
                write!(f, "fraction `{}` is outside [0, 1]", Echo(token))
            }
            TraceErrorKind::DirectiveAfterOperation {
                directive,
                first_op_line,
            } => write!(
                f,
                "directive `{directive}` after the first operation (line {first_op_line}); \
                 directives go before every operation"
            ),
            TraceErrorKind::DuplicateDirective {
                directive,
                first_line,
            } => {
                write!(
                    f,
                    "directive `{directive}` given twice (first at line {first_line})"
                )
            }
            TraceErrorKind::UnknownOption { keyword, token } => write!(
                f,
                "unknown option `{}` after `{keyword}`: expected {}",
                Echo(token),
                match *keyword {
                    "pool" => "`use_on_oom` or `no_split`, each at most once",
                    "retain_cpu_backup" => "`on` or `off`",
                    _ => "`cpu_backup`",
                }
            ),
            TraceErrorKind::UnknownFlavour { token } => {
                write!(
                    f,
                    "unknown flavour `{}`: expected `torch_npu` or `cuda`",
                    Echo(token)
                )
            }
            TraceErrorKind::UnknownCall { token } => write!(
                f,
                "unknown device call `{}` (one of: {})",
                Echo(token),
                DeviceCall::ALL.map(DeviceCall::name).join(", ")
            ),
            TraceErrorKind::UnknownFault { token } => {
                write!(
                    f,
                    "unknown fault `{}`: expected `oom` or `error <code>`",
                    Echo(token)
                )
            }
            TraceErrorKind::BadNumber {
                what,
                token,
                expected,
            } => {
                write!(f, "bad {what} `{}`: expected {expected}", Echo(token))
            }
            TraceErrorKind::TooManyIds => f.write_str("more than 2^32 distinct ids"),
        }
    }
}

/// A trace file that could not be read or did not parse.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be read.
    Io {
        /// The path, as displayed.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The file is malformed.
    Parse(TraceError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Io { path, error } => write!(f, "{path}: {error}"),
            LoadError::Parse(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Io { error, .. } => Some(error),
            LoadError::Parse(e) => Some(e),
        }
    }
}

/// Reads and parses the trace file at `path`; messages name the file as `path` displays.
pub fn load(path: impl AsRef<Path>) -> Result<Trace, LoadError> {
    let path = path.as_ref();
    let name = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => parse_bytes(&name, &bytes).map_err(LoadError::Parse),
        Err(error) => Err(LoadError::Io { path: name, error }),
    }
}

/// Parses a trace given as text; `file` names it in error messages.
pub fn parse_str(file: &str, text: &str) -> Result<Trace, TraceError> {
    parse_bytes(file, text.as_bytes())
}

/// Parses a trace given as raw bytes (a line that is not UTF-8 is malformed); `file` names it in
/// error messages.
pub fn parse_bytes(file: &str, bytes: &[u8]) -> Result<Trace, TraceError> {
    let mut parser = Parser::new(file);
    for (index, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        parser.line(line, raw).map_err(|kind| TraceError {
            file: file.to_owned(),
            line,
            kind,
        })?;
    }
    Ok(parser.finish())
}

/// The directives, in the order of the `seen` array.
#[derive(Debug, Clone, Copy)]
enum Directive {
    Capacity = 0,
    Conf = 1,
    DeviceOverhead = 2,
    Pad = 3,
    Flavour = 4,
}

impl Directive {
    const fn name(self) -> &'static str {
        match self {
            Directive::Capacity => "capacity",
            Directive::Conf => "conf",
            Directive::DeviceOverhead => "device_overhead",
            Directive::Pad => "pad",
            Directive::Flavour => "flavour",
        }
    }
}

/// The tokens of one line after its keyword.
struct Args<I> {
    keyword: &'static str,
    rest: I,
}

impl<'a, I: Iterator<Item = &'a str>> Args<I> {
    fn need(&mut self, expected: &'static str) -> Result<&'a str, TraceErrorKind> {
        self.rest.next().ok_or(TraceErrorKind::MissingToken {
            keyword: self.keyword,
            expected,
        })
    }

    fn optional(&mut self) -> Option<&'a str> {
        self.rest.next()
    }

    fn end(mut self) -> Result<(), TraceErrorKind> {
        match self.rest.next() {
            None => Ok(()),
            Some(token) => Err(TraceErrorKind::ExtraToken {
                keyword: self.keyword,
                token: token.to_owned(),
            }),
        }
    }
}

fn size_arg(token: &str) -> Result<u64, TraceErrorKind> {
    parse_size(token).map_err(|error| TraceErrorKind::BadSize {
        token: token.to_owned(),
        error,
    })
}

fn stream_arg(token: &str) -> Result<u64, TraceErrorKind> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TraceErrorKind::BadStream {
            token: token.to_owned(),
        });
    }
    token.parse().map_err(|_| TraceErrorKind::StreamTooLarge {
        token: token.to_owned(),
    })
}

/// A non-negative integer in decimal, or hexadecimal with `0x` (addresses).
fn number_arg(what: &'static str, token: &str) -> Result<u64, TraceErrorKind> {
    let parsed = match token.strip_prefix("0x") {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(hex, 16).ok()
        }
        Some(_) => None,
        None if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) => {
            token.parse().ok()
        }
        None => None,
    };
    parsed.ok_or_else(|| TraceErrorKind::BadNumber {
        what,
        token: token.to_owned(),
        expected: "an integer from 0 to 2^64 - 1 (decimal, or hexadecimal after 0x)",
    })
}

fn fraction_arg(token: &str) -> Result<f64, TraceErrorKind> {
    let f: f64 = token.parse().map_err(|_| TraceErrorKind::BadFraction {
        token: token.to_owned(),
    })?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(TraceErrorKind::FractionOutOfRange {
            token: token.to_owned(),
        })
    }
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The parser's state between lines.
struct Parser<'a> {
    trace: Trace,
    names: HashMap<&'a str, u32>,
    seen: [Option<usize>; 5],
    first_op_line: Option<usize>,
}

impl<'a> Parser<'a> {
    fn new(file: &str) -> Self {
        Parser {
            trace: Trace::new(file),
            names: HashMap::new(),
            seen: [None; 5],
            first_op_line: None,
        }
    }

    fn finish(self) -> Trace {
        self.trace
    }

    fn line(&mut self, line: usize, raw: &'a [u8]) -> Result<(), TraceErrorKind> {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let text = std::str::from_utf8(raw).map_err(|_| TraceErrorKind::NotUtf8)?;
        if line == 1 && text.starts_with('\u{feff}') {
            return Err(TraceErrorKind::ByteOrderMark);
        }
        let text = text.split_once('#').map_or(text, |(code, _comment)| code);
        let mut tokens = text.split(is_blank).filter(|t| !t.is_empty());
        let Some(keyword) = tokens.next() else {
            return Ok(()); // blank or comment-only line
        };
        let directive = match keyword {
            "capacity" => Some(Directive::Capacity),
            "conf" => Some(Directive::Conf),
            "device_overhead" => Some(Directive::DeviceOverhead),
            "pad" => Some(Directive::Pad),
            "flavour" => Some(Directive::Flavour),
            _ => None,
        };
        if let Some(d) = directive {
            return self.directive(line, d, text, tokens);
        }
        let kind = self.operation(keyword, tokens)?;
        self.first_op_line.get_or_insert(line);
        self.trace.ops.push(Op { line, kind });
        Ok(())
    }

    fn directive(
        &mut self,
        line: usize,
        d: Directive,
        text: &'a str,
        tokens: impl Iterator<Item = &'a str>,
    ) -> Result<(), TraceErrorKind> {
        if let Some(first_op_line) = self.first_op_line {
            return Err(TraceErrorKind::DirectiveAfterOperation {
                directive: d.name(),
                first_op_line,
            });
        }
        if let Some(first_line) = self.seen[d as usize] {
            return Err(TraceErrorKind::DuplicateDirective {
                directive: d.name(),
                first_line,
            });
        }
        let mut args = Args {
            keyword: d.name(),
            rest: tokens,
        };
        match d {
            Directive::Conf => {
                // The rest of the line, verbatim apart from the blanks around it.
                let rest = text.trim_start_matches(is_blank)["conf".len()..].trim_matches(is_blank);
                if rest.is_empty() {
                    return Err(TraceErrorKind::MissingToken {
                        keyword: "conf",
                        expected: "<string>",
                    });
                }
                self.trace.conf = Some(rest.to_owned());
            }
            Directive::Flavour => {
                let token = args.need("torch_npu|cuda")?;
                let flavour = [Flavour::TorchNpu, Flavour::Cuda]
                    .into_iter()
                    .find(|&f| crate::op::flavour_name(f) == token)
                    .ok_or_else(|| TraceErrorKind::UnknownFlavour {
                        token: token.to_owned(),
                    })?;
                args.end()?;
                self.trace.flavour = Some(flavour);
            }
            Directive::Capacity | Directive::DeviceOverhead | Directive::Pad => {
                let size = size_arg(args.need("<size>")?)?;
                args.end()?;
                let slot = match d {
                    Directive::Capacity => &mut self.trace.capacity,
                    Directive::DeviceOverhead => &mut self.trace.device_overhead,
                    _ => &mut self.trace.pad,
                };
                *slot = Some(size);
            }
        }
        self.seen[d as usize] = Some(line);
        Ok(())
    }

    fn operation(
        &mut self,
        keyword: &'a str,
        tokens: impl Iterator<Item = &'a str>,
    ) -> Result<OpKind, TraceErrorKind> {
        let keyword: &'static str = match KEYWORDS.iter().find(|&&k| k == keyword) {
            Some(k) => k,
            None => {
                return Err(TraceErrorKind::UnknownKeyword {
                    keyword: keyword.to_owned(),
                });
            }
        };
        let mut args = Args {
            keyword,
            rest: tokens,
        };
        let kind = match keyword {
            "alloc" => {
                let id = self.intern(args.need("<id>")?)?;
                let size = size_arg(args.need("<size>")?)?;
                let stream = args.optional().map(stream_arg).transpose()?.unwrap_or(0);
                args.end()?;
                OpKind::Alloc { id, size, stream }
            }
            "free" => {
                let id = self.intern(args.need("<id>")?)?;
                args.end()?;
                OpKind::Free { id }
            }
            "record" => {
                let id = self.intern(args.need("<id>")?)?;
                let stream = stream_arg(args.need("<stream>")?)?;
                args.end()?;
                OpKind::Record { id, stream }
            }
            "complete" => {
                let stream = args.optional().map(stream_arg).transpose()?;
                args.end()?;
                OpKind::Complete { stream }
            }
            "empty_cache" => {
                args.end()?;
                OpKind::EmptyCache {
                    free_physical: true,
                }
            }
            "empty_virt_addr_cache" => {
                args.end()?;
                OpKind::EmptyCache {
                    free_physical: false,
                }
            }
            "fraction" => {
                let f = fraction_arg(args.need("<fraction>")?)?;
                args.end()?;
                OpKind::Fraction(f)
            }
            "reset_peak" => {
                args.end()?;
                OpKind::ResetPeak
            }
            "reset_accumulated" => {
                args.end()?;
                OpKind::ResetAccumulated
            }
            "set_allocator_settings" => {
                let settings = args.need("<string>")?.to_owned();
                args.end()?;
                OpKind::Settings(settings)
            }
            "pool" => {
                let name = args.need("<name>")?.to_owned();
                let (mut use_on_oom, mut no_split) = (false, false);
                while let Some(token) = args.optional() {
                    match token {
                        "use_on_oom" if !use_on_oom => use_on_oom = true,
                        "no_split" if !no_split => no_split = true,
                        _ => {
                            return Err(TraceErrorKind::UnknownOption {
                                keyword,
                                token: token.to_owned(),
                            });
                        }
                    }
                }
                OpKind::Pool(PoolOp::Create {
                    name,
                    use_on_oom,
                    no_split,
                })
            }
            "use_pool" | "release_pool" => {
                let name = args.need("<name>")?.to_owned();
                args.end()?;
                OpKind::Pool(match keyword {
                    "use_pool" => PoolOp::Use(name),
                    _ => PoolOp::Release(name),
                })
            }
            "end_pool" => {
                args.end()?;
                OpKind::Pool(PoolOp::End)
            }
            "region" => {
                let tag = args.need("<tag>")?.to_owned();
                let cpu_backup = match args.optional() {
                    None => false,
                    Some("cpu_backup") => true,
                    Some(token) => {
                        return Err(TraceErrorKind::UnknownOption {
                            keyword,
                            token: token.to_owned(),
                        });
                    }
                };
                args.end()?;
                OpKind::Region { tag, cpu_backup }
            }
            "end_region" => {
                args.end()?;
                OpKind::EndRegion
            }
            "pause" | "resume" => {
                let tag = args.optional().map(str::to_owned);
                args.end()?;
                if keyword == "pause" {
                    OpKind::Pause(tag)
                } else {
                    OpKind::Resume(tag)
                }
            }
            "retain_cpu_backup" => {
                let retain = match args.need("on|off")? {
                    "on" => true,
                    "off" => false,
                    token => {
                        return Err(TraceErrorKind::UnknownOption {
                            keyword,
                            token: token.to_owned(),
                        });
                    }
                };
                args.end()?;
                OpKind::RetainCpuBackup(retain)
            }
            "memory_margin" => {
                let bytes = size_arg(args.need("<size>")?)?;
                args.end()?;
                OpKind::MemoryMargin(bytes)
            }
            "fill" | "expect" => {
                let id = self.intern(args.need("<id>")?)?;
                let token = args.need("<byte>")?;
                let byte = number_arg("<byte>", token)
                    .ok()
                    .and_then(|b| u8::try_from(b).ok())
                    .ok_or_else(|| TraceErrorKind::BadNumber {
                        what: "<byte>",
                        token: token.to_owned(),
                        expected: "an integer from 0 to 255",
                    })?;
                args.end()?;
                if keyword == "fill" {
                    OpKind::Fill { id, byte }
                } else {
                    OpKind::Expect { id, byte }
                }
            }
            "stats" => {
                let label = args.optional().map(str::to_owned);
                args.end()?;
                OpKind::Stats { label }
            }
            "fault" => {
                let token = args.need("<call>")?;
                let call = DeviceCall::ALL
                    .into_iter()
                    .find(|c| c.name() == token)
                    .ok_or_else(|| TraceErrorKind::UnknownCall {
                        token: token.to_owned(),
                    })?;
                let nth = number_arg("<nth>", args.need("<nth>")?)?;
                let fault = match args.need("oom|error")? {
                    "oom" => Fault::OutOfMemory,
                    "error" => {
                        let token = args.need("<code>")?;
                        // Decimal digits with an optional `-`: `i32`'s parser would also take
                        // a `+`, which no other number of the format allows.
                        let digits = token.strip_prefix('-').unwrap_or(token);
                        let code = (!digits.is_empty()
                            && digits.bytes().all(|b| b.is_ascii_digit()))
                        .then(|| token.parse().ok())
                        .flatten()
                        .ok_or_else(|| TraceErrorKind::BadNumber {
                            what: "<code>",
                            token: token.to_owned(),
                            expected: "an integer from -2147483648 to 2147483647 (an i32)",
                        })?;
                        Fault::Error(code)
                    }
                    other => {
                        return Err(TraceErrorKind::UnknownFault {
                            token: other.to_owned(),
                        });
                    }
                };
                args.end()?;
                OpKind::Fault { call, nth, fault }
            }
            "double_free" => {
                let id = self.intern(args.need("<id>")?)?;
                args.end()?;
                OpKind::Misuse(Misuse::DoubleFree { id })
            }
            "record_freed" => {
                let id = self.intern(args.need("<id>")?)?;
                let stream = stream_arg(args.need("<stream>")?)?;
                args.end()?;
                OpKind::Misuse(Misuse::RecordFreed { id, stream })
            }
            "free_foreign" => {
                let addr = number_arg("<address>", args.need("<address>")?)?;
                args.end()?;
                OpKind::Misuse(Misuse::ForeignPointer { addr })
            }
            "free_interior" => {
                let id = self.intern(args.need("<id>")?)?;
                args.end()?;
                OpKind::Misuse(Misuse::InteriorPointer { id })
            }
            "drain" => {
                args.end()?;
                OpKind::Drain
            }
            // Directives were handled by the caller.
            _ => {
                return Err(TraceErrorKind::UnknownKeyword {
                    keyword: keyword.to_owned(),
                });
            }
        };
        Ok(kind)
    }

    /// The index of `name`, creating it (never allocated) on first sight.
    fn intern(&mut self, name: &'a str) -> Result<IdRef, TraceErrorKind> {
        if let Some(&i) = self.names.get(name) {
            return Ok(IdRef(i));
        }
        if u32::try_from(self.trace.ids.len()).is_err() {
            return Err(TraceErrorKind::TooManyIds);
        }
        let id = self.trace.add_id(name);
        self.names.insert(name, id.0);
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        parse_str("t.trace", text)
    }

    fn ops(text: &str) -> Vec<OpKind> {
        parse(text)
            .unwrap()
            .ops
            .into_iter()
            .map(|op| op.kind)
            .collect()
    }

    /// The error of a malformed trace, checking its line number.
    fn err(text: &str, line: usize) -> TraceErrorKind {
        let e = parse(text).expect_err(text);
        assert_eq!(e.file, "t.trace");
        assert_eq!(e.line, line, "{e}");
        e.kind
    }

    fn msg(text: &str) -> String {
        parse(text).expect_err(text).to_string()
    }

    #[test]
    fn a_pool_takes_use_on_oom_and_no_split_once_each_in_any_order() {
        let pool = |use_on_oom, no_split| {
            OpKind::Pool(PoolOp::Create {
                name: "p".into(),
                use_on_oom,
                no_split,
            })
        };
        assert_eq!(ops("pool p\n"), [pool(false, false)]);
        assert_eq!(ops("pool p use_on_oom\n"), [pool(true, false)]);
        assert_eq!(ops("pool p no_split use_on_oom\n"), [pool(true, true)]);
        for line in [
            "pool p use_on_oom use_on_oom",
            "pool p split",
            "pool p no_split x",
        ] {
            assert!(matches!(
                err(&format!("{line}\n"), 1),
                TraceErrorKind::UnknownOption {
                    keyword: "pool",
                    ..
                }
            ));
        }
        assert_eq!(
            msg("pool p cpu_backup\n"),
            "t.trace:1: unknown option `cpu_backup` after `pool`: expected `use_on_oom` or \
             `no_split`, each at most once"
        );
        // Written back as read.
        let t = parse("pool p no_split use_on_oom\n").unwrap();
        let line = crate::write::Line::new(&t, &t.ops[0].kind).to_string();
        assert_eq!(line, "pool p use_on_oom no_split");
    }

    #[test]
    fn retain_cpu_backup_takes_on_or_off() {
        let t = parse("retain_cpu_backup on\nretain_cpu_backup off\n").unwrap();
        let kinds: Vec<_> = t.ops.iter().map(|op| op.kind.clone()).collect();
        assert_eq!(
            kinds,
            [
                OpKind::RetainCpuBackup(true),
                OpKind::RetainCpuBackup(false)
            ]
        );
        for op in &t.ops {
            let line = crate::write::Line::new(&t, &op.kind).to_string();
            assert_eq!(parse(&format!("{line}\n")).unwrap().ops[0].kind, op.kind);
        }
        assert_eq!(
            msg("retain_cpu_backup yes\n"),
            "t.trace:1: unknown option `yes` after `retain_cpu_backup`: expected `on` or `off`"
        );
        assert!(matches!(
            err("retain_cpu_backup\n", 1),
            TraceErrorKind::MissingToken { .. }
        ));
        assert!(matches!(
            err("retain_cpu_backup on off\n", 1),
            TraceErrorKind::ExtraToken { .. }
        ));
    }

    #[test]
    fn memory_margin_takes_one_size() {
        let t = parse("memory_margin 1.5G\nmemory_margin 0\n").unwrap();
        let kinds: Vec<_> = t.ops.iter().map(|op| op.kind.clone()).collect();
        assert_eq!(
            kinds,
            [OpKind::MemoryMargin(3 << 29), OpKind::MemoryMargin(0)]
        );
        for op in &t.ops {
            let line = crate::write::Line::new(&t, &op.kind).to_string();
            assert_eq!(parse(&format!("{line}\n")).unwrap().ops[0].kind, op.kind);
        }
        assert!(matches!(
            err("memory_margin\n", 1),
            TraceErrorKind::MissingToken { .. }
        ));
        assert!(matches!(
            err("memory_margin 1M 2M\n", 1),
            TraceErrorKind::ExtraToken { .. }
        ));
        assert!(matches!(
            err("memory_margin lots\n", 1),
            TraceErrorKind::BadSize { .. }
        ));
    }

    #[test]
    fn a_fault_code_is_a_decimal_i32_with_an_optional_minus() {
        for (token, code) in [("507899", 507_899), ("-5", -5), ("0", 0)] {
            let t = parse(&format!("fault malloc 1 error {token}\n")).unwrap();
            assert_eq!(
                t.ops[0].kind,
                OpKind::Fault {
                    call: DeviceCall::Malloc,
                    nth: 1,
                    fault: Fault::Error(code)
                }
            );
        }
        for token in ["+5", "-", "0x10", "2147483648", "5e3"] {
            assert_eq!(
                msg(&format!("fault malloc 1 error {token}\n")),
                format!(
                    "t.trace:1: bad <code> `{token}`: expected an integer from -2147483648 to \
                     2147483647 (an i32)"
                ),
            );
        }
    }

    #[test]
    fn empty_blank_and_comment_only() {
        for text in [
            "",
            "\n",
            "   \n\t\n",
            "# just a comment\n  # indented\n",
            "\r\n",
        ] {
            let t = parse(text).unwrap();
            assert!(t.ops.is_empty());
            assert_eq!(t.id_count(), 0);
            assert_eq!(
                (t.capacity, t.conf, t.device_overhead, t.pad),
                (None, None, None, None)
            );
        }
    }

    #[test]
    fn every_operation() {
        let text = "alloc a 1K\nalloc b 2M 3\nrecord a 7\nfree a\ncomplete\ncomplete 7\n\
                    empty_cache\nempty_virt_addr_cache\nfraction 0.5\nreset_peak\nreset_accumulated\nstats\n\
                    stats mid\n";
        let t = parse(text).unwrap();
        let a = IdRef(0);
        let b = IdRef(1);
        let kinds: Vec<_> = t.ops.iter().map(|o| o.kind.clone()).collect();
        assert_eq!(
            kinds,
            [
                OpKind::Alloc {
                    id: a,
                    size: 1024,
                    stream: 0
                },
                OpKind::Alloc {
                    id: b,
                    size: 2 << 20,
                    stream: 3
                },
                OpKind::Record { id: a, stream: 7 },
                OpKind::Free { id: a },
                OpKind::Complete { stream: None },
                OpKind::Complete { stream: Some(7) },
                OpKind::EmptyCache {
                    free_physical: true
                },
                OpKind::EmptyCache {
                    free_physical: false
                },
                OpKind::Fraction(0.5),
                OpKind::ResetPeak,
                OpKind::ResetAccumulated,
                OpKind::Stats { label: None },
                OpKind::Stats {
                    label: Some("mid".into())
                },
            ]
        );
        let lines: Vec<_> = t.ops.iter().map(|o| o.line).collect();
        assert_eq!(lines, (1..=13).collect::<Vec<_>>());
        let keywords: Vec<_> = t.ops.iter().map(|o| o.kind.keyword()).collect();
        assert_eq!(keywords[..4], ["alloc", "alloc", "record", "free"]);
        assert_eq!(keywords[6..8], ["empty_cache", "empty_virt_addr_cache"]);
        assert_eq!(t.id_name(a), "a");
        assert_eq!(t.id_name(b), "b");
        assert_eq!(t.id_name(IdRef(99)), "?");
        assert_eq!(t.id_count(), 2);
    }

    #[test]
    fn directives() {
        let text = "# header\ncapacity 16G\nconf max_split_size_mb:128,garbage_collection_threshold:0.6  # c\n\
                    device_overhead 512M\npad 0\n\nalloc x 1\n";
        let t = parse(text).unwrap();
        assert_eq!(t.capacity, Some(16 << 30));
        assert_eq!(
            t.conf.as_deref(),
            Some("max_split_size_mb:128,garbage_collection_threshold:0.6")
        );
        assert_eq!(t.device_overhead, Some(512 << 20));
        assert_eq!(t.pad, Some(0));
        assert_eq!(t.ops.len(), 1);
        assert_eq!(t.ops[0].line, 7);
    }

    #[test]
    fn conf_keeps_inner_blanks() {
        let t = parse("\t conf \t a:1, b:2\t\n").unwrap();
        assert_eq!(t.conf.as_deref(), Some("a:1, b:2"));
    }

    #[test]
    fn conf_needs_a_string() {
        assert_eq!(
            err("conf\n", 1),
            TraceErrorKind::MissingToken {
                keyword: "conf",
                expected: "<string>"
            }
        );
        assert_eq!(
            err("conf  # nothing\n", 1),
            TraceErrorKind::MissingToken {
                keyword: "conf",
                expected: "<string>"
            }
        );
        assert_eq!(msg("conf\n"), "t.trace:1: `conf` is missing <string>");
    }

    #[test]
    fn tabs_spaces_comments_and_crlf() {
        let text = "\talloc\t a \t 4K\t1  # trailing comment\r\nfree a#glued comment\r\n";
        assert_eq!(
            ops(text),
            [
                OpKind::Alloc {
                    id: IdRef(0),
                    size: 4096,
                    stream: 1
                },
                OpKind::Free { id: IdRef(0) }
            ]
        );
    }

    #[test]
    fn no_final_newline() {
        assert_eq!(ops("alloc a 1\nfree a").len(), 2);
    }

    #[test]
    fn sizes_in_operations() {
        let t = ops("alloc a 1.5M\nalloc b 0\nalloc c 3GiB\nalloc d 18446744073709551615\n");
        let sizes: Vec<u64> = t
            .iter()
            .map(|k| match k {
                OpKind::Alloc { size, .. } => *size,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(sizes, [3 << 19, 0, 3 << 30, u64::MAX]);
    }

    #[test]
    fn bad_sizes() {
        assert_eq!(
            err("alloc a 1.3K\n", 1),
            TraceErrorKind::BadSize {
                token: "1.3K".into(),
                error: SizeError::NotWhole
            }
        );
        assert_eq!(
            err("capacity 18446744073709551616\n", 1),
            TraceErrorKind::BadSize {
                token: "18446744073709551616".into(),
                error: SizeError::TooLarge
            }
        );
        assert_eq!(
            err("alloc a 1MB\n", 1),
            TraceErrorKind::BadSize {
                token: "1MB".into(),
                error: SizeError::UnknownSuffix
            }
        );
        assert_eq!(
            err("\n\npad -32\n", 3),
            TraceErrorKind::BadSize {
                token: "-32".into(),
                error: SizeError::Invalid
            }
        );
        assert_eq!(
            msg("alloc a 1.3K"),
            "t.trace:1: bad size `1.3K`: not a whole number of bytes"
        );
        assert_eq!(
            msg("device_overhead 17179869184G"),
            "t.trace:1: bad size `17179869184G`: does not fit in 64 bits"
        );
    }

    #[test]
    fn streams() {
        assert_eq!(
            ops("alloc a 1 18446744073709551615\n")[0],
            OpKind::Alloc {
                id: IdRef(0),
                size: 1,
                stream: u64::MAX
            }
        );
        assert_eq!(
            err("alloc a 1 -1\n", 1),
            TraceErrorKind::BadStream { token: "-1".into() }
        );
        assert_eq!(
            err("alloc a 1 +1\n", 1),
            TraceErrorKind::BadStream { token: "+1".into() }
        );
        assert_eq!(
            err("alloc a 1\nrecord a x\n", 2),
            TraceErrorKind::BadStream { token: "x".into() }
        );
        assert_eq!(
            err("complete 1.0\n", 1),
            TraceErrorKind::BadStream {
                token: "1.0".into()
            }
        );
        assert_eq!(
            err("complete 18446744073709551616\n", 1),
            TraceErrorKind::StreamTooLarge {
                token: "18446744073709551616".into()
            }
        );
        assert_eq!(
            msg("complete s1"),
            "t.trace:1: bad stream `s1`: expected a non-negative integer"
        );
        assert_eq!(
            msg("complete 99999999999999999999"),
            "t.trace:1: stream `99999999999999999999` does not fit in 64 bits"
        );
    }

    #[test]
    fn fractions() {
        assert_eq!(ops("fraction 0\n"), [OpKind::Fraction(0.0)]);
        assert_eq!(ops("fraction 1\n"), [OpKind::Fraction(1.0)]);
        assert_eq!(ops("fraction 0.25\n"), [OpKind::Fraction(0.25)]);
        assert_eq!(ops("fraction 1e-1\n"), [OpKind::Fraction(0.1)]);
        for bad in ["1.01", "-0.1", "2", "inf", "NaN", "1e400"] {
            assert_eq!(
                err(&format!("fraction {bad}\n"), 1),
                TraceErrorKind::FractionOutOfRange { token: bad.into() },
                "{bad}"
            );
        }
        for bad in ["half", "0.5.0", "0,5", ""] {
            let text = format!("fraction {bad}\n");
            if bad.is_empty() {
                assert_eq!(
                    err(&text, 1),
                    TraceErrorKind::MissingToken {
                        keyword: "fraction",
                        expected: "<fraction>"
                    }
                );
            } else {
                assert_eq!(
                    err(&text, 1),
                    TraceErrorKind::BadFraction { token: bad.into() }
                );
            }
        }
        assert_eq!(
            msg("fraction 1.5"),
            "t.trace:1: fraction `1.5` is outside [0, 1]"
        );
        assert_eq!(
            msg("fraction x"),
            "t.trace:1: bad fraction `x`: expected a number in [0, 1]"
        );
    }

    #[test]
    fn unknown_keywords() {
        assert_eq!(
            err("alloc a 1\nmalloc b 1\n", 2),
            TraceErrorKind::UnknownKeyword {
                keyword: "malloc".into()
            }
        );
        assert_eq!(
            msg("ALLOC a 1"),
            "t.trace:1: unknown keyword `ALLOC` (keywords are lower case)"
        );
        assert_eq!(
            msg("Capacity 1G"),
            "t.trace:1: unknown keyword `Capacity` (keywords are lower case)"
        );
        assert_eq!(msg("bogus"), "t.trace:1: unknown keyword `bogus`");
        assert_eq!(msg("emptycache"), "t.trace:1: unknown keyword `emptycache`");
    }

    #[test]
    fn missing_tokens() {
        let cases = [
            ("alloc", "alloc", "<id>"),
            ("alloc a", "alloc", "<size>"),
            ("free", "free", "<id>"),
            ("alloc a 1\nrecord a", "record", "<stream>"),
            ("record", "record", "<id>"),
            ("fraction", "fraction", "<fraction>"),
            ("capacity", "capacity", "<size>"),
            ("device_overhead", "device_overhead", "<size>"),
            ("pad # 32", "pad", "<size>"),
        ];
        for (text, keyword, expected) in cases {
            let line = text.lines().count();
            assert_eq!(
                err(text, line),
                TraceErrorKind::MissingToken { keyword, expected },
                "{text}"
            );
        }
        assert_eq!(msg("alloc a"), "t.trace:1: `alloc` is missing <size>");
    }

    #[test]
    fn extra_tokens() {
        let cases = [
            ("alloc a 1 0 x", "alloc", "x"),
            ("alloc a 1\nfree a a", "free", "a"),
            ("alloc a 1\nrecord a 1 2", "record", "2"),
            ("complete 1 2", "complete", "2"),
            ("empty_cache now", "empty_cache", "now"),
            ("fraction 0.5 0.6", "fraction", "0.6"),
            ("reset_peak all", "reset_peak", "all"),
            ("reset_accumulated 1", "reset_accumulated", "1"),
            ("stats two words", "stats", "words"),
            ("capacity 1G 2G", "capacity", "2G"),
            ("device_overhead 1 M", "device_overhead", "M"),
            ("pad 32 bytes", "pad", "bytes"),
        ];
        for (text, keyword, token) in cases {
            let line = text.lines().count();
            assert_eq!(
                err(text, line),
                TraceErrorKind::ExtraToken {
                    keyword,
                    token: token.into()
                },
                "{text}"
            );
        }
        assert_eq!(
            msg("empty_cache now"),
            "t.trace:1: extra token `now` after `empty_cache` and its arguments"
        );
    }

    #[test]
    fn directive_after_operation() {
        let text = "capacity 1G\n# ops\nalloc a 1\n\npad 0\n";
        assert_eq!(
            err(text, 5),
            TraceErrorKind::DirectiveAfterOperation {
                directive: "pad",
                first_op_line: 3
            }
        );
        assert_eq!(
            msg("stats\nconf x:1"),
            "t.trace:2: directive `conf` after the first operation (line 1); \
             directives go before every operation"
        );
    }

    #[test]
    fn duplicate_directive() {
        assert_eq!(
            err("capacity 1G\npad 0\ncapacity 2G\n", 3),
            TraceErrorKind::DuplicateDirective {
                directive: "capacity",
                first_line: 1
            }
        );
        assert_eq!(
            msg("conf a:1\nconf b:2"),
            "t.trace:2: directive `conf` given twice (first at line 1)"
        );
    }

    #[test]
    fn ids_are_reused_after_free() {
        let t = parse("alloc a 1\nalloc b 1\nfree a\nalloc a 2\nfree a\nfree b\n").unwrap();
        assert_eq!(t.id_count(), 2);
        assert_eq!(
            t.ops[3].kind,
            OpKind::Alloc {
                id: IdRef(0),
                size: 2,
                stream: 0
            }
        );
        assert_eq!(IdRef(1).index(), 1);
    }

    #[test]
    fn ids_may_be_any_token() {
        let t = parse("alloc ünï/c0de:7 1\nalloc 42 1\nfree ünï/c0de:7\n").unwrap();
        assert_eq!(t.id_name(IdRef(0)), "ünï/c0de:7");
        assert_eq!(t.id_name(IdRef(1)), "42");
    }

    #[test]
    fn non_utf8_line() {
        let e = parse_bytes("b.trace", b"alloc a 1\n# caf\xe9\n").unwrap_err();
        assert_eq!((e.line, &e.kind), (2, &TraceErrorKind::NotUtf8));
        assert_eq!(e.to_string(), "b.trace:2: line is not valid UTF-8");
        let e = parse_bytes("b.trace", b"alloc \xff\xfe 1").unwrap_err();
        assert_eq!(e.line, 1);
    }

    #[test]
    fn echoed_text_is_short_and_printable() {
        let long = "9".repeat(100_000);
        let m = msg(&format!("alloc a {long}"));
        assert_eq!(
            m,
            format!(
                "t.trace:1: bad size `{}… (100000 characters)`: does not fit in 64 bits",
                "9".repeat(40)
            )
        );
        assert!(m.len() < 200);
        assert_eq!(
            msg("alloc a 1\0x"),
            "t.trace:1: bad size `1\\0x`: unknown suffix (use K, KiB, M, MiB, G or GiB)"
        );
        assert_eq!(msg("\u{7}beep"), "t.trace:1: unknown keyword `\\u{7}beep`");
    }

    #[test]
    fn a_byte_order_mark_is_named() {
        assert_eq!(
            msg("\u{feff}capacity 1G\nalloc a 1\n"),
            "t.trace:1: the file starts with a UTF-8 byte-order mark (U+FEFF); save it without one"
        );
        assert_eq!(
            msg("alloc a 1\n\u{feff}free a\n"),
            "t.trace:2: unknown keyword `\\u{feff}free`"
        );
    }

    #[test]
    fn first_error_wins() {
        assert_eq!(msg("bogus\nfree x\n"), "t.trace:1: unknown keyword `bogus`");
    }

    #[test]
    fn ids_left_live_at_the_end_are_fine() {
        assert_eq!(ops("alloc a 1\nalloc b 2\n").len(), 2);
    }

    #[test]
    fn load_reads_files_and_reports_io_errors() {
        let dir = std::env::temp_dir().join(format!("alloc-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.trace");
        std::fs::write(&good, "alloc a 1\nfree a\n").unwrap();
        assert_eq!(load(&good).unwrap().ops.len(), 2);
        let bad = dir.join("bad.trace");
        std::fs::write(&bad, "bogus\n").unwrap();
        let e = load(&bad).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{}:1: unknown keyword `bogus`", bad.display())
        );
        assert!(matches!(e, LoadError::Parse(_)));
        let missing = dir.join("missing.trace");
        let e = load(&missing).unwrap_err();
        assert!(matches!(e, LoadError::Io { .. }));
        assert!(e.to_string().starts_with(&missing.display().to_string()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
