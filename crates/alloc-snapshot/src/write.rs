//! Writing a snapshot as a pickle.
//!
//! serde-pickle writes protocol 3 with `EMPTY_DICT`/`SETITEMS`, `EMPTY_LIST`/`APPENDS`,
//! `BINUNICODE`, `BININT*`, `LONG1` (8 bytes for an `i64`), `BINFLOAT`, `NEWTRUE`/`NEWFALSE`,
//! `MARK … TUPLE` and `NONE`: all within what memory_viz's JavaScript unpickler reads (protocol
//! 2 to 4, no bytes, sets or objects). The model keeps every integer an `i64` so that no wider
//! `LONG1` appears.

use std::fmt;
use std::path::Path;

use crate::model::Snapshot;

/// Why a snapshot could not be written.
#[derive(Debug)]
pub enum WriteError {
    /// The pickle encoder refused the data.
    Pickle(serde_pickle::Error),
    /// The file could not be written.
    Io(std::io::Error),
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteError::Pickle(e) => write!(f, "cannot encode the snapshot as a pickle: {e}"),
            WriteError::Io(e) => write!(f, "cannot write the snapshot: {e}"),
        }
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WriteError::Pickle(e) => Some(e),
            WriteError::Io(e) => Some(e),
        }
    }
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        WriteError::Io(e)
    }
}

impl Snapshot {
    /// The snapshot as pickle bytes (protocol 3), what `torch.cuda.memory._dump_snapshot`
    /// writes.
    pub fn to_pickle(&self) -> Result<Vec<u8>, WriteError> {
        serde_pickle::to_vec(self, serde_pickle::SerOptions::new()).map_err(WriteError::Pickle)
    }

    /// Writes the pickle to `path`.
    pub fn write(&self, path: &Path) -> Result<(), WriteError> {
        std::fs::write(path, self.to_pickle()?)?;
        Ok(())
    }
}
