//! Standard output for the commands: a reader that goes away (`npu-alloc replay ... --json |
//! head`) ends the program quietly, as Unix tools do, instead of a panic about a broken pipe.

use std::fmt;
use std::io::{ErrorKind, Write};

/// Writes one line to stdout; on a closed pipe, exits with status 0 (the reader has what it
/// wanted); any other write error exits with status 1 and a message on stderr.
pub fn line(args: fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{args}").and_then(|()| out.flush()) {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` through [`line`] (exported for `cargo xtask`'s own commands).
#[macro_export]
macro_rules! say {
    () => {
        $crate::print_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

/// "s" unless `n` is 1: "1 stream", "2 streams".
pub(crate) fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
