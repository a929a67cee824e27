//! Enums whose discriminants are numbers on the wire.

/// Declare a fieldless enum whose discriminants are its wire numbers, with
/// `from_wire` mapping a number back (None for one this build does not
/// know). One list per enum, so a number can never be added to the enum and
/// forgotten in the decoder.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $repr:ty {
            $($(#[$vmeta:meta])* $variant:ident = $value:expr,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr($repr)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        impl $name {
            /// The variant with wire number `v`, if this build knows it.
            pub fn from_wire(v: $repr) -> Option<Self> {
                $(if v == $value {
                    return Some($name::$variant);
                })+
                None
            }
        }
    };
}

pub(crate) use wire_enum;
