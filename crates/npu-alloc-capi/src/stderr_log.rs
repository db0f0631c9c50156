//! The runtime's warnings (its `log` records) on stderr, as the library's own: a C or Python
//! host sets no Rust logger, and without one every warning the runtime logs would be lost (the
//! missing synchronize hook, a free that could not drain, a device not bound back).

/// Writes warnings and errors as `npu-alloc: ...` lines.
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            crate::exports::warn(*record.args());
        }
    }

    fn flush(&self) {}
}

static STDERR: Stderr = Stderr;

/// Installs the stderr logger, unless the process has a logger already (a Rust host's).
pub(crate) fn install() {
    if log::set_logger(&STDERR).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}
