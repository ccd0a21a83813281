//! How users write values, once for the CLI and the environment: byte sizes
//! (`4096`, `16M`, `1G`, as nccl-tests takes them) and named choices (one
//! list of names per type, parsed from it and listed by clap's `--help`).
//! The bottom of the layers: imports nothing of rankmesh.

/// A byte size: a number with an optional K/M/G suffix (powers of 1024), as
/// nccl-tests' `-b`/`-e` take it (a fraction is truncated, as there). `None`
/// for anything else, a negative size, or more than [`MAX_SIZE`].
pub fn parse_size(s: &str) -> Option<u64> {
    size_in_bytes(s).map(|b| b as u64)
}

/// [`parse_size`] for a count that must be whole (`1.5K` is, `1.5` is not):
/// the `RANKMESH_*_BYTES` variables.
pub fn parse_whole_size(s: &str) -> Option<u64> {
    size_in_bytes(s)
        .filter(|b| b.fract() == 0.0)
        .map(|b| b as u64)
}

/// The grammar both share: bytes as an `f64`, exact below [`MAX_SIZE`].
fn size_in_bytes(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let v: f64 = num.trim().parse().ok()?;
    let bytes = v * mult as f64;
    // Above 2^53 a byte count is no longer exact in f64, and far above any
    // machine's memory: refused here rather than saturated into a panic.
    (v >= 0.0 && bytes <= MAX_SIZE as f64).then_some(bytes)
}

/// Largest size accepted (8 PiB, exact in f64).
pub const MAX_SIZE: u64 = 1 << 53;

/// A closed set of named values a user picks from (an option, an
/// environment variable): the names are written once, in [`name`](Self::name).
pub trait Choice: Copy + 'static {
    /// Every value, in the order `--help` lists them.
    const ALL: &'static [Self];
    /// The value's name, as users type it.
    fn name(self) -> &'static str;
    /// The value named exactly `s`.
    fn named(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == s)
    }
}

/// Makes a type with an inherent `name(self) -> &'static str` a [`Choice`]
/// over the values `$all`, and a `clap::ValueEnum`, so `--help` lists its
/// names: `choice!(ReduceOp, &ReduceOp::ALL);`.
macro_rules! choice {
    ($t:ty, $all:expr) => {
        impl $crate::parse::Choice for $t {
            const ALL: &'static [Self] = $all;
            fn name(self) -> &'static str {
                <$t>::name(self)
            }
        }
        impl clap::ValueEnum for $t {
            fn value_variants<'a>() -> &'a [Self] {
                <$t as $crate::parse::Choice>::ALL
            }
            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                Some(clap::builder::PossibleValue::new(<$t>::name(*self)))
            }
        }
    };
}
pub(crate) use choice;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_nccl_tests_writes_them() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size(" 16M "), Some(16 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("8192P"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("1e30"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("1.5"), Some(1));
        assert_eq!(parse_whole_size("1.5"), None);
        assert_eq!(parse_whole_size("1.5K"), Some(1536));
        assert_eq!(parse_whole_size(" 16M "), Some(16 << 20));
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Colour {
        Red,
        Blue,
    }
    impl Colour {
        fn name(self) -> &'static str {
            match self {
                Colour::Red => "red",
                Colour::Blue => "blue",
            }
        }
    }
    choice!(Colour, &[Colour::Red, Colour::Blue]);

    #[test]
    fn choices_parse_from_their_names_and_list_them_for_clap() {
        assert_eq!(Colour::named("blue"), Some(Colour::Blue));
        assert_eq!(Colour::named(" blue"), None);
        assert_eq!(Colour::named("green"), None);
        let listed: Vec<String> = <Colour as clap::ValueEnum>::value_variants()
            .iter()
            .map(|c| {
                clap::ValueEnum::to_possible_value(c)
                    .unwrap()
                    .get_name()
                    .to_string()
            })
            .collect();
        assert_eq!(listed, ["red", "blue"]);
        assert_eq!(
            <Colour as clap::ValueEnum>::from_str("red", false),
            Ok(Colour::Red)
        );
    }
}
