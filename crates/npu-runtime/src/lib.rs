//! The std runtime over alloc-core and acl-sys (not built yet).
