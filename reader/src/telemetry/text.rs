//! Shared text of the model: names, categories and argument values are [`Text`] (a reference-counted
//! string, cloned without allocating), and an importer makes each distinct string once through a
//! [`Texts`] interner. A million spans of one op then hold one `"MUL_MAT"`, and handing a span on
//! costs no allocation.

use std::borrow::Borrow;
use std::cell::Cell;
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
/// shared) all are forgotten, so memory stays bounded. The texts found last are also kept in a
/// small direct-mapped table, so that the few names a trace repeats millions of times cost a
/// comparison, not a hash lookup.
#[derive(Debug)]
pub struct ByAddress<V: Copy> {
    map: FxHashMap<usize, (Text, V)>,
    /// Entries of `map` found last, by address (0: none).
    recent: [Cell<(usize, Option<V>)>; RECENT],
}

/// Entries of [`ByAddress`]'s table of recent texts (a power of two).
const RECENT: usize = 64;

impl<V: Copy> Default for ByAddress<V> {
    fn default() -> Self {
        ByAddress {
            map: FxHashMap::default(),
            recent: std::array::from_fn(|_| Cell::new((0, None))),
        }
    }
}

impl<V: Copy> ByAddress<V> {
    pub const LIMIT: usize = 1 << 16;

    fn slot(addr: usize) -> usize {
        (addr >> 4).wrapping_mul(0x9E37_79B9) % RECENT
    }

    pub fn get(&self, t: &Text) -> Option<V> {
        let addr = t.addr();
        let recent = &self.recent[Self::slot(addr)];
        if let (cached, Some(v)) = recent.get()
            && cached == addr
        {
            return Some(v);
        }
        let v = self.map.get(&addr).map(|&(_, v)| v)?;
        recent.set((addr, Some(v)));
        Some(v)
    }

    pub fn insert(&mut self, t: &Text, value: V) {
        if self.map.len() >= Self::LIMIT {
            self.clear();
        }
        self.map.insert(t.addr(), (t.clone(), value));
        self.recent[Self::slot(t.addr())].set((t.addr(), Some(value)));
    }

    /// Forgets every text.
    pub fn clear(&mut self) {
        self.map.clear();
        self.recent.iter().for_each(|r| r.set((0, None)));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A text found once (so in the table of recent texts) is forgotten with the rest: after
    /// `clear`, and when the map passes its limit; an equal text made apart is another key.
    #[test]
    fn forgotten_texts_are_not_found_through_the_recent_table() {
        let mut values = ByAddress::default();
        let name = Text::from("MUL_MAT");
        values.insert(&name, 7u32);
        assert_eq!(values.get(&name), Some(7));
        assert_eq!(values.get(&Text::from("MUL_MAT")), None);
        values.clear();
        assert_eq!(values.get(&name), None);
        values.insert(&name, 8);
        assert_eq!(values.get(&name), Some(8));
        let others: Vec<Text> = (0..ByAddress::<u32>::LIMIT)
            .map(|i| Text::from(i.to_string()))
            .collect();
        for (i, t) in others.iter().enumerate() {
            values.insert(t, i as u32);
        }
        assert_eq!(values.get(&name), None, "forgotten when the map was full");
        assert_eq!(
            values.get(others.last().unwrap()),
            Some(others.len() as u32 - 1)
        );
    }
}
