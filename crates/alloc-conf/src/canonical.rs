//! Writing an [`AllocConf`] back as its canonical config string: the non-default settings as
//! `key:value`, in the order of the key table, so that parsing it gives the same value.

use core::fmt;

use crate::conf::{AllocConf, Backend, MIB};
use crate::roundup;

/// The canonical config string: `""` for the defaults, otherwise the settings that differ from
/// them, comma-separated in key-table order. For a configuration [`crate::parse`] can produce,
/// parsing this string gives the same configuration.
impl fmt::Display for AllocConf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = AllocConf::default();
        let mut sep = "";
        let mut item = |f: &mut fmt::Formatter<'_>, key: &str, value: &dyn fmt::Display| {
            let r = write!(f, "{sep}{key}:{value}");
            sep = ",";
            r
        };
        if let Some(split) = self.max_split_size {
            item(f, "max_split_size_mb", &(split / MIB))?;
        }
        if self.max_non_split_rounding != self.large_segment_size {
            item(
                f,
                "max_non_split_rounding_mb",
                &(self.max_non_split_rounding / MIB),
            )?;
        }
        if self.large_segment_size != d.large_segment_size {
            item(f, "large_segment_size_mb", &(self.large_segment_size / MIB))?;
        }
        if let Some(v) = self.garbage_collection_threshold {
            // `{}` on f64 is the shortest decimal that reads back to the same value.
            item(f, "garbage_collection_threshold", &v)?;
        }
        if self.expandable_segments {
            item(f, "expandable_segments", &"True")?;
        }
        if self.base_addr_aligned != d.base_addr_aligned {
            let kb = if self.base_addr_aligned == 512 {
                0
            } else {
                self.base_addr_aligned / 1024
            };
            item(f, "base_addr_aligned_kb", &kb)?;
        }
        if self.page_size.is_some() {
            item(f, "page_size", &"1g")?;
        }
        if self.segment_size != self.large_segment_size {
            item(f, "segment_size_mb", &(self.segment_size / MIB))?;
        }
        if let Some(value) = roundup::canonical(&self.roundup_power2_divisions) {
            item(f, "roundup_power2_divisions", &value)?;
        }
        if self.per_process_memory_fraction != d.per_process_memory_fraction {
            item(
                f,
                "per_process_memory_fraction",
                &self.per_process_memory_fraction,
            )?;
        }
        let flags = [
            ("release_lock_on_npumalloc", self.release_lock_on_npumalloc),
            ("multi_stream_lazy_reclaim", self.multi_stream_lazy_reclaim),
            ("throw_on_npumalloc_oom", self.throw_on_npumalloc_oom),
            (
                "pinned_use_background_threads",
                self.pinned_use_background_threads,
            ),
            (
                "pin_memory_expandable_segments",
                self.pin_memory_expandable_segments,
            ),
            ("pinned_mem_register", self.pinned_mem_register),
        ];
        for (key, on) in flags {
            if on {
                item(f, key, &"True")?;
            }
        }
        if self.pinned_num_register_threads != d.pinned_num_register_threads {
            item(
                f,
                "pinned_num_register_threads",
                &self.pinned_num_register_threads,
            )?;
        }
        match self.backend {
            Backend::Native => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{AllocConf, MIB, parse};
    use alloc::string::ToString;

    #[test]
    fn defaults_write_the_empty_string() {
        assert_eq!(AllocConf::default().to_string(), "");
    }

    #[test]
    fn every_setting_in_table_order() {
        let s = "max_split_size_mb:64,max_non_split_rounding_mb:40,large_segment_size_mb:32,\
                 garbage_collection_threshold:0.6,base_addr_aligned_kb:0,page_size:1g,\
                 roundup_power2_divisions:[256:1,512:2,1024:4,>:8],\
                 per_process_memory_fraction:0.5,release_lock_on_npumalloc:True,\
                 pinned_use_background_threads:True,pin_memory_expandable_segments:True,\
                 pinned_num_register_threads:8";
        let p = parse(s);
        assert_eq!(p.conf.to_string(), s);
        assert_eq!(parse(&p.conf.to_string()).conf, p.conf);
    }

    #[test]
    fn segment_keys_and_expandable() {
        let p = parse("expandable_segments:True,segment_size_mb:40,base_addr_aligned_kb:8");
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(
            p.conf.to_string(),
            "expandable_segments:True,base_addr_aligned_kb:8,segment_size_mb:40"
        );
        // large_segment_size_mb alone also sets the segment size: only it is written.
        let p = parse("large_segment_size_mb:64");
        assert_eq!(p.conf.segment_size, 64 * MIB);
        assert_eq!(p.conf.to_string(), "large_segment_size_mb:64");
        // max_non_split_rounding follows the large segment size unless set.
        assert_eq!(p.conf.max_non_split_rounding, 64 * MIB);
    }

    #[test]
    fn fractions_are_written_exactly() {
        for v in [0.0, 1e-7, 0.1, 1.0 / 3.0, 0.9999999999999999] {
            let c = AllocConf {
                per_process_memory_fraction: v,
                ..AllocConf::default()
            };
            assert_eq!(parse(&c.to_string()).conf, c, "{v}");
        }
        let c = AllocConf {
            garbage_collection_threshold: Some(5e-324),
            ..AllocConf::default()
        };
        assert_eq!(parse(&c.to_string()).conf, c);
    }
}
