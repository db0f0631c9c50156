//! Whether `page_size:1g` gets 1 GiB pages (torch_npu's `IsMallocPage1GMem`) and whether
//! requests are padded by 32 bytes (`AddPadSize`): torch_npu's version gates, with its rules for
//! reading CANN and driver version strings (`GetCANNInfo.cpp`).
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

/// torch_npu's `isDigits`: not empty, decimal digits only.
fn is_digits(part: &str) -> bool {
    !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit())
}

/// torch_npu's `ExtractNumFromStr`: the number, or -1 when the part is not all digits or does
/// not fit an `i64`.
fn extract(part: &str) -> i64 {
    if is_digits(part) {
        part.parse().unwrap_or(-1)
    } else {
        -1
    }
}

/// torch_npu's `StartsWith`: `prefix` (ASCII) at the start of `part`, in any case. When true,
/// `part[prefix.len()..]` is a valid slice.
fn starts(part: &str, prefix: &str) -> bool {
    part.as_bytes()
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

// The three `*ToNum` functions follow torch_npu's code branch by branch (its -1 and -51
// sentinels stand for "not in this version"); their arithmetic wraps where C++'s would (a part
// of 18 digits can overflow it).

/// The major and minor of a version of three parts or more, when both are numbers (torch_npu's
/// `VersionToNum` and `DriverVersionToNum` give 0 otherwise).
fn major_minor(t: &[&str]) -> Option<(i64, i64)> {
    if t.len() < 3 {
        return None;
    }
    let (major, minor) = (extract(t[0]), extract(t[1]));
    (major != -1 && minor != -1).then_some((major, minor))
}

/// A part of decimal digits that fits an `i64`.
fn plain(part: &str) -> Option<i64> {
    let n = extract(part);
    (n != -1).then_some(n)
}

/// The number after `prefix` in `part` (`RC1`, `T5`, `alpha002`, `b083`): `part` starts with it
/// in any case, something follows, and that is a [`plain`] number.
fn numbered(part: &str, prefix: &str) -> Option<i64> {
    if starts(part, prefix) && part.len() > prefix.len() {
        plain(&part[prefix.len()..])
    } else {
        None
    }
}

/// A third and last part as `VersionToNum` and `DriverVersionToNum` both read it: `RC<n>`,
/// `T<n>` or `<n>`, as (release, rc, t) with the other two at their sentinels.
fn third_part(part: &str) -> Option<(i64, i64, i64)> {
    numbered(part, "RC")
        .map(|rc| (-1, rc, -1))
        .or_else(|| numbered(part, "T").map(|t| (-1, -51, t)))
        .or_else(|| plain(part).map(|release| (release, -51, -1)))
}

/// The sum `VersionToNum` and `DriverVersionToNum` both start from.
fn base_num(major: i64, minor: i64, release: i64, rc: i64, t: i64) -> i64 {
    (major.wrapping_add(1).wrapping_mul(100_000_000))
        .wrapping_add(minor.wrapping_add(1).wrapping_mul(1_000_000))
        .wrapping_add(release.wrapping_add(1).wrapping_mul(10_000))
        .wrapping_add(rc.wrapping_add(1).wrapping_mul(100).wrapping_add(5000))
        .wrapping_add(t.wrapping_add(1).wrapping_mul(100))
}

/// torch_npu's `VersionToNum`, for CANN versions before 8.5 (`8.1.RC1`, `8.0.T5`, `7.0.0`,
/// `8.1.RC1.alpha002`, `8.0.0.alpha003`); 0 for anything else.
fn version_to_num(version: &str) -> i64 {
    let t = parts(version);
    let Some((major, minor)) = major_minor(&t) else {
        return 0;
    };
    // (release, rc, t, alpha, weight, prerelease)
    let (release, rc, tv, alpha, weight, pre) = match t.len() {
        3 => match third_part(t[2]) {
            Some((release, rc, tv)) => (release, rc, tv, 0, 0, 0),
            None => return 0,
        },
        // `RC<n>.alpha<n>`, or `<n>.alpha<n>`: a pre-release, weighed down by 300.
        4 => match (numbered(t[2], "RC"), plain(t[2]), numbered(t[3], "alpha")) {
            (Some(rc), _, Some(alpha)) => (-1, rc, -1, alpha, 0, 0),
            (_, Some(release), Some(pre)) => (release, -51, -1, 0, 300, pre),
            _ => return 0,
        },
        _ => return 0,
    };
    base_num(major, minor, release, rc, tv)
        .wrapping_sub(100i64.wrapping_sub(alpha))
        .wrapping_sub(weight)
        .wrapping_add(pre)
}

/// torch_npu's `VersionV2ToNum`, for CANN 8.5 and later (`8.5.0`, `8.5.0-beta`, `8.5.0.rc1`,
/// `8.5.0-beta.1`); 0 for anything else.
fn version_v2_to_num(version: &str) -> i64 {
    let t = parts(version);
    if t.len() < 3 {
        return 0;
    }
    let (Some(major), Some(minor), Some(patch)) = (plain(t[0]), plain(t[1]), plain(t[2])) else {
        return 0;
    };
    // A pre-release stage weighs the version down.
    let stage = |part: &str| match part {
        "alpha" => Some(300),
        "beta" => Some(200),
        "rc" => Some(100),
        _ => None,
    };
    let (weight, pre) = match t.len() {
        3 => (0, 0),
        // `-beta`, or a numbered stage in any case, as `.beta1`.
        4 => match stage(t[3]).map(|weight| (weight, 0)).or_else(|| {
            [("alpha", 300), ("beta", 200), ("rc", 100)]
                .into_iter()
                .find_map(|(name, weight)| numbered(t[3], name).map(|n| (weight, n)))
        }) {
            Some(stage) => stage,
            None => return 0,
        },
        // `-beta.1`
        5 => match (stage(t[3]), plain(t[4])) {
            (Some(weight), Some(n)) => (weight, n),
            _ => return 0,
        },
        _ => return 0,
    };
    major
        .wrapping_mul(10_000_000)
        .wrapping_add(minor.wrapping_mul(100_000))
        .wrapping_add(patch.wrapping_mul(1_000))
        .wrapping_sub(weight)
        .wrapping_add(pre)
}

/// torch_npu's `DriverVersionToNum` (`25.0.RC1`, `24.1.0`, `25.0.rc1.1`, `25.0.RC1.alpha001`,
/// `25.0.RC1.beta2`, `24.1.0.3`, `26.1.0.b083`); 0 for anything else.
fn driver_version_to_num(version: &str) -> i64 {
    let t = parts(version);
    let Some((major, minor)) = major_minor(&t) else {
        return 0;
    };
    // (release, rc, t, patch, beta, alpha)
    let (release, rc, tv, patch, beta, alpha) = match t.len() {
        3 => match third_part(t[2]) {
            Some((release, rc, tv)) => (release, rc, tv, 0, 1, 0),
            None => return 0,
        },
        4 => {
            let (third, fourth) = (t[2], t[3]);
            if let (Some(release), Some(patch)) = (plain(third), plain(fourth)) {
                (release, -51, -1, patch, 1, 0)
            } else if let Some(rc) = numbered(third, "RC") {
                if let Some(patch) = plain(fourth) {
                    (-1, rc, -1, patch, 1, 0)
                } else if let Some(alpha) = numbered(fourth, "alpha") {
                    (-1, rc, -1, 0, 1, alpha)
                } else if let Some(beta) = numbered(fourth, "beta") {
                    (-1, rc, -1, 0, beta, 0)
                } else {
                    return 0;
                }
            } else if is_digits(third) && !starts(fourth, "beta") {
                // A build, as `26.1.0.b083`: its number is the patch. torch_npu tests only
                // that the third part is digits, and does not read it.
                match numbered(fourth, "b") {
                    Some(build) => (-1, -51, -1, build, 1, 0),
                    None => return 0,
                }
            } else {
                return 0;
            }
        }
        _ => return 0,
    };
    let alpha_offset = if alpha != 0 {
        100i64.wrapping_sub(alpha)
    } else {
        0
    };
    base_num(major, minor, release, rc, tv)
        .wrapping_sub(alpha_offset)
        .wrapping_add(beta.wrapping_sub(1))
        .wrapping_add(patch)
}

/// torch_npu's `CompareVersionsByDispatch`: whether CANN version `current` is `target` or
/// later, `None` when either is unreadable (three parts or fewer, or a major or minor that is
/// not digits). Two versions before 8.5 compare by [`version_to_num`], two of 8.5 or two from 9
/// on by [`version_v2_to_num`], others by major and minor alone.
fn compare_versions(current: &str, target: &str) -> Option<bool> {
    let (c, t) = (parts(current), parts(target));
    if c.len() <= 2 || t.len() <= 2 {
        return None;
    }
    if !(is_digits(c[0]) && is_digits(c[1]) && is_digits(t[0]) && is_digits(t[1])) {
        return None;
    }
    // As in torch_npu, a major or minor too large for an i64 reads as -1 here.
    let (c_major, c_minor) = (extract(c[0]), extract(c[1]));
    let (t_major, t_minor) = (extract(t[0]), extract(t[1]));
    Some(
        if c_major == 8 && c_minor < 5 && t_major == 8 && t_minor < 5 {
            version_to_num(current) >= version_to_num(target)
        } else if (c_major, c_minor, t_major, t_minor) == (8, 5, 8, 5)
            || (c_major > 8 && t_major > 8)
        {
            version_v2_to_num(current) >= version_v2_to_num(target)
        } else if c_major != t_major {
            c_major > t_major
        } else {
            c_minor >= t_minor
        },
    )
}

/// The oldest CANN with which torch_npu drops its 32-byte pad on Ascend 950 parts
/// (`kMinDel32PaddingSizeCannVersion`).
pub(crate) const MIN_CANN_VERSION_NO_PAD: &str = "9.1.0";

/// torch_npu's `AddPadSize`: 0 on an Ascend 950 part (a SoC name starting with `Ascend950`,
/// the one family `GetSocVersion` ranks at or above it) with CANN 9.1.0 or later, else 32.
/// `None`: not reported (a library without `aclrtGetSocName` or `aclsysGetCANNVersion`).
pub(crate) fn pad(soc: Option<&str>, cann: impl FnOnce() -> Option<String>) -> u64 {
    let ascend950 = soc.is_some_and(|s| s.starts_with("Ascend950"));
    // The CANN version is asked only on such a part, as torch_npu's `&&` does.
    if ascend950 && is_gte_cann_version(cann().as_deref().unwrap_or(""), MIN_CANN_VERSION_NO_PAD) {
        0
    } else {
        32
    }
}

/// torch_npu's `IsGteCANNVersion` for the installed CANN `current`: an unreadable version is
/// not.
fn is_gte_cann_version(current: &str, boundary: &str) -> bool {
    compare_versions(current, boundary) == Some(true)
}

/// torch_npu's `IsGteDriverVersion`: whether the driver is `boundary` or later, asked only of a
/// CANN of 8.1.RC1 or later. The numbers are compared as `double`s, as torch_npu compares them.
fn is_gte_driver_version(cann: &str, driver: &str, boundary: &str) -> bool {
    if !is_gte_cann_version(cann, MIN_CANN_VERSION) {
        return false;
    }
    driver_version_to_num(driver) as f64 >= driver_version_to_num(boundary) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pad_is_dropped_only_on_ascend_950_with_cann_9_1_or_later() {
        let v = |v: &'static str| move || Some(v.to_owned());
        assert_eq!(pad(Some("Ascend950PR_9599"), v("9.1.0")), 0);
        assert_eq!(pad(Some("Ascend950DT_9591"), v("9.2.0")), 0);
        assert_eq!(pad(Some("Ascend950PR_9599"), v("9.0.0")), 32);
        assert_eq!(pad(Some("Ascend950PR_9599"), v("8.5.0")), 32);
        assert_eq!(pad(Some("Ascend950PR_9599"), || None), 32);
        assert_eq!(pad(Some("Ascend910B1"), v("9.1.0")), 32);
        assert_eq!(pad(Some("Ascend910_9391"), v("9.1.0")), 32);
        // torch_npu's prefix test is case-sensitive.
        assert_eq!(pad(Some("ascend950PR_9599"), v("9.1.0")), 32);
        assert_eq!(pad(None, v("9.1.0")), 32);
        // The version is not asked on other parts.
        assert_eq!(pad(Some("Ascend910B1"), || unreachable!()), 32);
    }

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
        // A minor too large for an i64 reads as -1, as torch_npu's ExtractNumFromStr does.
        assert_eq!(
            compare_versions("10.99999999999999999999.0", "8.1.RC1"),
            Some(true)
        );
    }

    #[test]
    fn numbers_too_large_wrap_or_read_as_torch_npu_reads_them() {
        // No panic: the arithmetic wraps as C++'s does.
        for v in [
            "92233720368547758.0.0",
            "8.1.RC92233720368547758",
            "9.0.0.rc9223372036854775807",
            "9223372036854775807.9223372036854775807.9223372036854775807",
        ] {
            version_to_num(v);
            version_v2_to_num(v);
            driver_version_to_num(v);
            huge_pages_1g(Some(v), Some(v));
        }
        // A release too large for an i64 is left unread in a build version, as in torch_npu.
        assert_eq!(
            driver_version_to_num("26.1.99999999999999999999.b083"),
            2_702_000_083
        );
        assert_eq!(version_to_num("8.1.99999999999999999999"), 0);
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
