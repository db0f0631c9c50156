//! Whether `page_size:1g` gets 1 GiB pages: torch_npu's version gate (`IsMallocPage1GMem`),
//! with its rules for reading CANN and driver version strings (`GetCANNInfo.cpp`).
//!
//! torch_npu backs `page_size:1g` with 1 GiB pages only with CANN 8.1.RC1 or later and a driver
//! of 25.0.RC1 or later, both as `aclsysGetCANNVersion` reports them; otherwise it warns and runs
//! as without the setting. A version it cannot read counts as too old. The numbers below follow
//! its formulas (torch_npu 9e73e708) exactly, quirks included, so that a machine gets the pages
//! it would get under torch_npu.

/// The oldest CANN with 1 GiB pages (torch_npu's `kMinCannVersion`).
pub(crate) const MIN_CANN_VERSION: &str = "8.1.RC1";
/// The oldest driver with 1 GiB pages (torch_npu's `kMinDriverVersion`).
pub(crate) const MIN_DRIVER_VERSION: &str = "25.0.RC1";

/// Whether `page_size:1g` gets 1 GiB pages with this CANN and driver (`None`: not reported).
pub(crate) fn huge_pages_1g(cann: Option<&str>, driver: Option<&str>) -> bool {
    let cann = cann.unwrap_or("");
    is_gte_cann_version(cann, MIN_CANN_VERSION)
        && is_gte_driver_version(cann, driver.unwrap_or(""), MIN_DRIVER_VERSION)
}

/// The parts of a version, split at every `.` and `-` (empty parts kept).
fn parts(version: &str) -> Vec<&str> {
    version.split(['.', '-']).collect()
}

/// A part of decimal digits only, as a number; `None` otherwise (or beyond `i64`).
fn number(part: &str) -> Option<i64> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    part.parse().ok()
}

/// The number after `prefix` (matched without regard to case) when something follows it.
fn after(part: &str, prefix: &str) -> Option<Option<i64>> {
    let head = part.get(..prefix.len())?;
    (head.eq_ignore_ascii_case(prefix) && part.len() > prefix.len())
        .then(|| number(&part[prefix.len()..]))
}

/// torch_npu's `VersionToNum`, for CANN versions before 8.5 (`8.1.RC1`, `8.0.T5`, `7.0.0`,
/// `8.1.RC1.alpha002`, `8.0.0.alpha003`); 0 for anything else.
fn version_to_num(version: &str) -> i64 {
    let p = parts(version);
    if p.len() < 3 {
        return 0;
    }
    let (Some(major), Some(minor)) = (number(p[0]), number(p[1])) else {
        return 0;
    };
    let (mut release, mut rc, mut t, mut alpha, mut weight, mut pre) = (-1, -51, -1, 0, 0, 0);
    let mut parsed = false;
    if p.len() == 3 {
        if let Some(Some(n)) = after(p[2], "RC") {
            (rc, parsed) = (n, true);
        } else if let Some(Some(n)) = after(p[2], "T") {
            (t, parsed) = (n, true);
        } else if let Some(n) = number(p[2]) {
            (release, parsed) = (n, true);
        }
    } else if p.len() == 4 {
        if let (Some(Some(r)), Some(Some(a))) = (after(p[2], "RC"), after(p[3], "alpha")) {
            (rc, alpha, parsed) = (r, a, true);
        } else if let (Some(r), Some(Some(a))) = (number(p[2]), after(p[3], "alpha")) {
            (release, weight, pre, parsed) = (r, 300, a, true);
        }
    }
    if !parsed {
        return 0;
    }
    (major + 1) * 100_000_000
        + (minor + 1) * 1_000_000
        + (release + 1) * 10_000
        + ((rc + 1) * 100 + 5000)
        + (t + 1) * 100
        - (100 - alpha)
        - weight
        + pre
}

/// torch_npu's `VersionV2ToNum`, for CANN 8.5 and later (`8.5.0`, `8.5.0-beta`, `8.5.0.rc1`,
/// `8.5.0-beta.1`); 0 for anything else.
fn version_v2_to_num(version: &str) -> i64 {
    let p = parts(version);
    if p.len() < 3 {
        return 0;
    }
    let (Some(major), Some(minor), Some(patch)) = (number(p[0]), number(p[1]), number(p[2])) else {
        return 0;
    };
    let stage = |s: &str| match s {
        "alpha" => Some(300),
        "beta" => Some(200),
        "rc" => Some(100),
        _ => None,
    };
    let (weight, pre) = match p.len() {
        3 => (0, 0),
        4 => match stage(p[3]) {
            Some(w) => (w, 0),
            None => {
                let numbered = [("alpha", 300), ("beta", 200), ("rc", 100)]
                    .into_iter()
                    .find_map(|(name, w)| after(p[3], name).map(|n| (w, n)));
                match numbered {
                    Some((w, Some(n))) => (w, n),
                    _ => return 0,
                }
            }
        },
        5 => match (number(p[4]), stage(p[3])) {
            (Some(n), Some(w)) => (w, n),
            _ => return 0,
        },
        _ => return 0,
    };
    major * 10_000_000 + minor * 100_000 + patch * 1_000 - weight + pre
}

/// torch_npu's `DriverVersionToNum` (`25.0.RC1`, `24.1.0`, `25.0.rc1.1`, `25.0.RC1.alpha001`,
/// `25.0.RC1.beta2`, `24.1.0.3`, `26.1.0.b083`); 0 for anything else.
fn driver_version_to_num(version: &str) -> i64 {
    let p = parts(version);
    if p.len() < 3 {
        return 0;
    }
    let (Some(major), Some(minor)) = (number(p[0]), number(p[1])) else {
        return 0;
    };
    let (mut release, mut t, mut rc, mut patch, mut beta, mut alpha) = (-1, -1, -51, 0, 1, 0);
    let mut parsed = false;
    if p.len() == 3 {
        if let Some(Some(n)) = after(p[2], "RC") {
            (rc, parsed) = (n, true);
        } else if let Some(Some(n)) = after(p[2], "T") {
            (t, parsed) = (n, true);
        } else if let Some(n) = number(p[2]) {
            (release, parsed) = (n, true);
        }
    } else if p.len() == 4 {
        if let (Some(r), Some(n)) = (number(p[2]), number(p[3])) {
            (release, patch, parsed) = (r, n, true);
        } else if let (Some(Some(r)), Some(n)) = (after(p[2], "RC"), number(p[3])) {
            (rc, patch, parsed) = (r, n, true);
        } else if let (Some(Some(r)), Some(Some(a))) = (after(p[2], "RC"), after(p[3], "alpha")) {
            (rc, alpha, parsed) = (r, a, true);
        } else if let (Some(Some(r)), Some(Some(b))) = (after(p[2], "RC"), after(p[3], "beta")) {
            (rc, beta, parsed) = (r, b, true);
        } else if let (Some(_), Some(Some(build)), None) =
            (number(p[2]), after(p[3], "b"), after(p[3], "beta"))
        {
            // A build, as `26.1.0.b083`: its number is the patch, and the release stays unread
            // (torch_npu sets only the patch here).
            (patch, parsed) = (build, true);
        }
    }
    if !parsed {
        return 0;
    }
    let alpha_offset = if alpha != 0 { 100 - alpha } else { 0 };
    (major + 1) * 100_000_000
        + (minor + 1) * 1_000_000
        + (release + 1) * 10_000
        + ((rc + 1) * 100 + 5000)
        + (t + 1) * 100
        - alpha_offset
        + (beta - 1)
        + patch
}

/// torch_npu's `CompareVersionsByDispatch`: whether CANN version `current` is `target` or
/// later, `None` when either is unreadable (fewer than three parts, or a major or minor that is
/// not a number). Two versions before 8.5 compare by [`version_to_num`], two of 8.5 or two from
/// 9 on by [`version_v2_to_num`], others by major and minor alone.
fn compare_versions(current: &str, target: &str) -> Option<bool> {
    let (c, t) = (parts(current), parts(target));
    if c.len() <= 2 || t.len() <= 2 {
        return None;
    }
    let (c_major, c_minor) = (number(c[0])?, number(c[1])?);
    let (t_major, t_minor) = (number(t[0])?, number(t[1])?);
    Some(
        if c_major == 8 && c_minor < 5 && t_major == 8 && t_minor < 5 {
            version_to_num(current) >= version_to_num(target)
        } else if (c_major, c_minor, t_major, t_minor) == (8, 5, 8, 5)
            || (c_major > 8 && t_major > 8)
        {
            version_v2_to_num(current) >= version_v2_to_num(target)
        } else {
            (c_major, c_minor) >= (t_major, t_minor)
        },
    )
}

/// torch_npu's `IsGteCANNVersion` for the installed CANN `current`: an unreadable version is
/// not.
fn is_gte_cann_version(current: &str, boundary: &str) -> bool {
    compare_versions(current, boundary) == Some(true)
}

/// torch_npu's `IsGteDriverVersion`: whether the driver is `boundary` or later, asked only of a
/// CANN of 8.1.RC1 or later.
fn is_gte_driver_version(cann: &str, driver: &str, boundary: &str) -> bool {
    if !is_gte_cann_version(cann, MIN_CANN_VERSION) {
        return false;
    }
    driver_version_to_num(driver) >= driver_version_to_num(boundary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cann_versions_before_8_5_read_as_torch_npu_reads_them() {
        // (major+1)·1e8 + (minor+1)·1e6 + (release+1)·1e4 + (rc+1)·100 + 5000 + (t+1)·100
        // − (100 − alpha) − weight + pre.
        assert_eq!(version_to_num("8.1.RC1"), 902_005_100);
        assert_eq!(version_to_num("8.0.RC3"), 901_005_300);
        assert_eq!(version_to_num("8.0.rc3"), 901_005_300);
        assert_eq!(version_to_num("8.0.T5"), 901_000_500);
        assert_eq!(version_to_num("7.0.0"), 801_009_900);
        assert_eq!(version_to_num("8.5.0"), 906_009_900);
        assert_eq!(version_to_num("8.1.RC1.alpha002"), 902_005_102);
        assert_eq!(version_to_num("8.0.0.alpha003"), 901_009_603);
        for bad in [
            "",
            "8",
            "8.1",
            "8.x.RC1",
            "8.1.RC",
            "8.1.beta1",
            "8.5.0-beta.1",
        ] {
            assert_eq!(version_to_num(bad), 0, "{bad}");
        }
    }

    #[test]
    fn cann_versions_from_8_5_read_as_torch_npu_reads_them() {
        assert_eq!(version_v2_to_num("8.5.0"), 80_500_000);
        assert_eq!(version_v2_to_num("8.5.0-alpha"), 80_499_700);
        assert_eq!(version_v2_to_num("8.5.0-beta"), 80_499_800);
        assert_eq!(version_v2_to_num("8.5.0.rc2"), 80_499_902);
        assert_eq!(version_v2_to_num("8.5.0.Beta3"), 80_499_803);
        assert_eq!(version_v2_to_num("8.5.0-beta.1"), 80_499_801);
        assert_eq!(version_v2_to_num("9.0.1"), 90_001_000);
        for bad in [
            "8.5",
            "8.5.x",
            "8.5.0-gamma",
            "8.5.0-beta.x",
            "8.5.0-x.1",
            "8.5.0.1.2.3",
        ] {
            assert_eq!(version_v2_to_num(bad), 0, "{bad}");
        }
    }

    #[test]
    fn driver_versions_read_as_torch_npu_reads_them() {
        assert_eq!(driver_version_to_num("25.0.RC1"), 2_601_005_200);
        assert_eq!(driver_version_to_num("25.0.rc1"), 2_601_005_200);
        assert_eq!(driver_version_to_num("24.1.0"), 2_502_010_000);
        assert_eq!(driver_version_to_num("24.1.0.3"), 2_502_010_003);
        assert_eq!(driver_version_to_num("25.0.RC1.1"), 2_601_005_201);
        assert_eq!(driver_version_to_num("25.0.RC1.alpha001"), 2_601_005_101);
        assert_eq!(driver_version_to_num("25.0.RC1.beta2"), 2_601_005_201);
        assert_eq!(driver_version_to_num("25.5.0"), 2_606_010_000);
        // A build: (release + 1) stays 0, the build number is the patch.
        assert_eq!(driver_version_to_num("26.1.0.b083"), 2_702_000_083);
        assert_eq!(driver_version_to_num("26.1.0.beta1"), 0);
        for bad in ["", "25", "25.0", "25.0.X1", "25.0.RC1.gamma1", "x.0.RC1"] {
            assert_eq!(driver_version_to_num(bad), 0, "{bad}");
        }
    }

    #[test]
    fn cann_versions_compare_as_torch_npu_dispatches_them() {
        assert_eq!(compare_versions("8.1.RC1", "8.1.RC1"), Some(true));
        assert_eq!(compare_versions("8.0.RC3", "8.1.RC1"), Some(false));
        assert_eq!(compare_versions("8.5.0", "8.5.0-beta.1"), Some(true));
        assert_eq!(compare_versions("8.5.0-beta.1", "8.5.0"), Some(false));
        assert_eq!(compare_versions("9.0.0.rc1", "9.0.0"), Some(false));
        assert_eq!(compare_versions("9.1.0", "8.1.RC1"), Some(true));
        assert_eq!(compare_versions("7.9.9", "8.1.RC1"), Some(false));
        assert_eq!(compare_versions("8.1", "8.1.RC1"), None);
        assert_eq!(compare_versions("", "8.1.RC1"), None);
        assert_eq!(compare_versions("x.1.0", "8.1.RC1"), None);
    }

    #[test]
    fn one_gib_pages_need_cann_8_1_rc1_and_driver_25_0_rc1() {
        let yes = |c, d| huge_pages_1g(Some(c), Some(d));
        assert!(yes("8.1.RC1", "25.0.RC1"));
        assert!(yes("8.2.RC1", "25.2.0"));
        assert!(yes("8.5.0", "25.5.0"));
        assert!(yes("9.0.0", "26.0.0"));
        // Too old a CANN, or too old a driver.
        assert!(!yes("8.0.RC3", "25.5.0"));
        assert!(!yes("8.0.0", "25.5.0"));
        assert!(!yes("7.0.0", "25.5.0"));
        assert!(!yes("8.1.RC1", "24.1.0"));
        assert!(!yes("8.5.0", "24.1.RC3"));
        // Pre-releases of 8.5 and 9 compare by major and minor against 8.1.RC1.
        for cann in [
            "8.5.0-beta.1",
            "8.5.0.rc1",
            "8.5.0-beta",
            "9.0.0.rc1",
            "9.0.0-beta.1",
        ] {
            assert!(yes(cann, "25.5.0"), "{cann}");
        }
        // A driver build, as `26.1.0.b083`.
        assert!(yes("8.5.0", "26.1.0.b083"));
        assert!(!yes("8.5.0", "24.1.0.b083"));
        // Not reported (no aclsysGetCANNVersion), or unreadable.
        assert!(!huge_pages_1g(None, Some("25.5.0")));
        assert!(!huge_pages_1g(Some("8.5.0"), None));
        assert!(!yes("unknown", "25.5.0"));
    }
}
