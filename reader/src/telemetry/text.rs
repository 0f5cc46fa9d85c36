//! Shared text of the model: names, categories and argument values are [`Text`] (a reference-counted
//! string, cloned without allocating), and an importer makes each distinct string once through a
//! [`Texts`] interner. A million spans of one op then hold one `"MUL_MAT"`, and handing a span on
//! costs no allocation.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::rc::Rc;

use rustc_hash::{FxHashMap, FxHashSet};

/// An immutable string shared by the records that name it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Text(Rc<str>);

impl Text {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Where the shared string lies: the same for every clone of one `Text`, different for two
    /// `Text`s alive at once (equal strings made apart included).
    pub fn addr(&self) -> usize {
        Rc::as_ptr(&self.0) as *const u8 as usize
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text(s.into())
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        Text(s.into())
    }
}

impl From<&String> for Text {
    fn from(s: &String) -> Text {
        Text(s.as_str().into())
    }
}

impl From<Text> for String {
    fn from(t: Text) -> String {
        t.0.to_string()
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl PartialEq<Text> for str {
    fn eq(&self, other: &Text) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Text> for &str {
    fn eq(&self, other: &Text) -> bool {
        *self == &*other.0
    }
}

/// Values found by the address of a shared [`Text`] ([`Text::addr`]): a repeated name is found
/// without hashing or comparing its text. Each text is kept beside its value, so that no other
/// string takes its address; past [`ByAddress::LIMIT`] entries (texts made anew per record, not
/// shared) all are forgotten, so memory stays bounded.
#[derive(Debug)]
pub struct ByAddress<V> {
    map: FxHashMap<usize, (Text, V)>,
}

impl<V> Default for ByAddress<V> {
    fn default() -> Self {
        ByAddress {
            map: FxHashMap::default(),
        }
    }
}

impl<V> ByAddress<V> {
    pub const LIMIT: usize = 1 << 16;

    pub fn get(&self, t: &Text) -> Option<&V> {
        self.map.get(&t.addr()).map(|(_, v)| v)
    }

    pub fn insert(&mut self, t: &Text, value: V) {
        if self.map.len() >= Self::LIMIT {
            self.map.clear();
        }
        self.map.insert(t.addr(), (t.clone(), value));
    }
}

/// Each distinct string once: an importer's names, categories and values.
#[derive(Debug, Default)]
pub struct Texts {
    known: FxHashSet<Text>,
}

impl Texts {
    /// The one [`Text`] equal to `s`, made on first sight.
    pub fn get(&mut self, s: &str) -> Text {
        if let Some(t) = self.known.get(s) {
            return t.clone();
        }
        let t = Text::from(s);
        self.known.insert(t.clone());
        t
    }
}

impl serde::Serialize for Text {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}
