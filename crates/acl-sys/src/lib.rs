//! Ascend ACL bindings loaded at run time (not built yet).
