//! User-facing names of the core's enums, each from one table.
//!
//! Every enum a user picks a value of (optimizer, precision, attention, strategy, …) is declared
//! with the crate-private `named_enum!` macro: one row per variant gives the variant, the name users type and read
//! (CLI values, JSON, fixtures) and a one-line help. From that table come `name()`, `help()`,
//! `FromStr` (whose error names the field, the bad value and the accepted names), `Display`,
//! serde's `Serialize`/`Deserialize` (as the name), `ALL` and `NAMES` — so no other crate has to
//! mirror the enum by hand. A front end builds its value parser from [`Named`]: the names, the
//! help lines and `FromStr`.

use crate::error::CoreError;

/// An enum whose values have user-facing names from one table (declared with the `named_enum!` macro).
pub trait Named: Copy + Eq + Sized + 'static {
    /// The field the value fills, as errors name it (`optimizer`, `precision`, …).
    const FIELD: &'static str;
    /// Every value, in table order.
    const VALUES: &'static [Self];
    /// The user-facing name.
    fn name(self) -> &'static str;
    /// One line of help for the value.
    fn help(self) -> &'static str;
}

/// Parses a user-facing name into a [`Named`] value; the error names the field, the bad value
/// and every accepted name.
pub fn parse_named<T: Named>(s: &str) -> Result<T, CoreError> {
    T::VALUES
        .iter()
        .copied()
        .find(|v| v.name() == s)
        .ok_or_else(|| {
            let accepted: Vec<&str> = T::VALUES.iter().map(|v| v.name()).collect();
            CoreError::invalid(
                T::FIELD,
                format!("unknown value `{s}` (accepted: {})", accepted.join(", ")),
            )
        })
}

/// Declares a fieldless enum from a table of `Variant = "name": "help"` rows and derives its
/// names (see the module documentation).
///
/// ```ignore
/// named_enum! {
///     /// Pipeline schedule.
///     pub enum Schedule in "schedule" {
///         /// One-forward-one-backward.
///         OneFOneB = "1f1b": "1F1B",
///     }
/// }
/// ```
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident in $field:literal {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $uname:literal : $help:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                $variant,
            )+
        }

        impl $name {
            /// Every value with its user-facing name, in table order.
            pub const ALL: [($name, &'static str); <[&str]>::len(&[$($uname),+])] =
                [$(($name::$variant, $uname)),+];
            /// Every user-facing name, in table order.
            pub const NAMES: [&'static str; <[&str]>::len(&[$($uname),+])] = [$($uname),+];

            /// The user-facing name.
            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $uname,)+
                }
            }

            /// One line of help for the value.
            pub const fn help(self) -> &'static str {
                match self {
                    $($name::$variant => $help,)+
                }
            }
        }

        impl $crate::names::Named for $name {
            const FIELD: &'static str = $field;
            const VALUES: &'static [Self] = &[$($name::$variant),+];
            fn name(self) -> &'static str {
                $name::name(self)
            }
            fn help(self) -> &'static str {
                $name::help(self)
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::error::CoreError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $crate::names::parse_named(s)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(<D::Error as ::serde::de::Error>::custom)
            }
        }
    };
}

pub(crate) use named_enum;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Precision;
    use crate::layout::{Offload, OffloadDevice, Schedule, Strategy};
    use crate::optimizer::Optimizer;
    use crate::workload::{AttentionImpl, KvDtype};

    fn round_trips<T: Named + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned>() {
        let mut seen = std::collections::HashSet::new();
        for &v in T::VALUES {
            assert!(seen.insert(v.name()), "duplicate name {}", v.name());
            assert_eq!(parse_named::<T>(v.name()), Ok(v));
            assert!(!v.help().is_empty(), "{v:?} has no help");
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{}\"", v.name()));
            assert_eq!(serde_json::from_str::<T>(&json).unwrap(), v);
        }
        let e = parse_named::<T>("no-such-value").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(T::FIELD) && msg.contains("no-such-value"),
            "{msg}"
        );
        assert!(T::VALUES.iter().all(|v| msg.contains(v.name())), "{msg}");
    }

    #[test]
    fn every_table_round_trips_and_refuses_unknown_names() {
        round_trips::<Optimizer>();
        round_trips::<Precision>();
        round_trips::<AttentionImpl>();
        round_trips::<KvDtype>();
        round_trips::<Strategy>();
        round_trips::<Schedule>();
        round_trips::<Offload>();
        round_trips::<OffloadDevice>();
    }

    #[test]
    fn names_are_the_cli_spellings() {
        // crates/memwall-cli/src/args.rs ValueEnum names, which JSON and fixtures use too
        assert_eq!(
            Optimizer::NAMES,
            [
                "adamw",
                "adamw-fused",
                "adamw-forloop",
                "adamw-8bit",
                "sgd",
                "sgd-momentum",
                "adafactor",
                "lion"
            ]
        );
        assert_eq!(
            Precision::NAMES,
            ["bf16", "fp16", "fp32", "amp-bf16", "amp-fp16"]
        );
        assert_eq!(AttentionImpl::NAMES, ["sdpa", "eager", "flash"]);
        assert_eq!(KvDtype::NAMES, ["auto", "bf16", "fp16", "fp8", "int8"]);
        assert_eq!(
            Strategy::NAMES,
            [
                "ddp",
                "zero1",
                "zero2",
                "zero3",
                "fsdp-full",
                "fsdp-grad-op",
                "hsdp"
            ]
        );
        assert_eq!(Schedule::NAMES, ["1f1b", "interleaved", "gpipe"]);
        assert_eq!(Offload::NAMES, ["none", "optimizer", "params", "both"]);
        assert_eq!(OffloadDevice::NAMES, ["cpu", "nvme"]);
    }
}
