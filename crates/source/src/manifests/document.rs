//! The parse of one YAML document, with the entries of a list's `items` handed to the loader
//! one at a time as they are read, so that a `kind: List` of thousands of objects is never
//! held whole.
//!
//! A document is read with a [`DeserializeSeed`] that carries the loader: a top-level mapping
//! is read key by key, every key but `items` into a [`Value`]; each entry of a top-level
//! `items` sequence is parsed into a [`Value`] (with its line), handed to
//! [`ManifestLoader::add_value`] and dropped before the next entry is read. What the loader
//! does with an entry depends on the list it belongs to, and `kubectl get -o yaml` prints keys
//! sorted, so `kind` (`List`, `ServiceList`) comes after `items`:
//!
//! - An entry that names its own `kind` and `apiVersion` (all of `kubectl`'s output), or that
//!   is not a mapping, loads the same in every list: it is handed over at once, on the
//!   assumption that the document is a list. The loader records what it did since the
//!   document started ([`ManifestLoader::begin_document`]) and undoes it when the assumption
//!   fails: the rest of the document does not parse, or its `kind` is not a list kind, or it
//!   has no `apiVersion` ([`ManifestLoader::end_document`]).
//! - An entry without its own `kind` or `apiVersion` takes the list's (typed lists such as
//!   `ServiceList`). When the parse has already read them, it is handed over with them; when
//!   it has not, the entries handed over so far are undone, the rest are only parsed, and
//!   once the parse has read the list's `kind` and `apiVersion` the document is parsed a
//!   second time knowing them ([`Items::Restart`]). Only such a list (typed, its items without
//!   `kind`, its keys sorted) is parsed twice.
//!
//! So the loader sees the same entries, in the same order, with the same lines, as when the
//! whole document was one [`Value`] tree: the errors, the duplicates and what each file
//! defined do not change; only the memory does (one entry's tree at a time instead of the
//! whole List's, about 8 bytes of heap per byte of YAML).
//!
//! Any other document (one object, or a mapping whose `kind` is read before its `items` and is
//! not a list kind) is parsed into one [`Value`], as before.

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::{At, ManifestLoader, list_item_kind};

/// A list's kind and `apiVersion` as its items need them: the kind its items default to (`""`
/// for `List`, whose items carry their own), and the `apiVersion`.
pub(super) type ListHeader = (&'static str, String);

/// What happened to the entries of a document's top-level `items`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Items {
    /// None was handed to the loader: the document has no `items` sequence, or it is not a
    /// list and its `items` stayed in [`ParsedDocument::value`].
    Kept,
    /// Every entry was handed to the loader; they stand if the document is a list.
    Streamed,
    /// An entry needed the list's `kind` or `apiVersion` before the parse had read them: the
    /// entries handed over before it were undone and the rest only parsed. If the document is
    /// a list, it has to be parsed again with its [`ListHeader`] known.
    Restart,
}

/// A parsed document: its value (for a mapping whose `items` were handed over, the mapping
/// without them) and what happened to its `items`.
pub(super) struct ParsedDocument {
    /// The document's value.
    pub(super) value: Value,
    /// What happened to its `items`.
    pub(super) items: Items,
}

/// Where a document's items go.
pub(super) struct Target<'l, 'a> {
    /// The loader that takes them.
    pub(super) loader: &'l mut ManifestLoader,
    /// The document's location and label (`document 3`).
    pub(super) at: &'a At<'a>,
    /// 1-based line of the document's first line in the file.
    pub(super) first_line: usize,
    /// The list's header, when known before the parse (the second parse of a
    /// [`Items::Restart`]).
    pub(super) known: Option<ListHeader>,
}

/// Parses one document's text (or reader) with `options`, handing a list's items to
/// `target.loader` as they are read (see the module documentation).
pub(super) fn parse<R: std::io::Read>(
    input: Input<'_, R>,
    options: serde_saphyr::Options,
    target: Target<'_, '_>,
) -> Result<ParsedDocument, serde_saphyr::Error> {
    let mut state = State {
        target,
        restart: false,
    };
    match input {
        Input::Text(text) => {
            serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
                DocumentSeed { state: &mut state }.deserialize(de)
            })
        }
        Input::Reader(reader) => {
            serde_saphyr::with_deserializer_from_reader_with_options(reader, options, |de| {
                DocumentSeed { state: &mut state }.deserialize(de)
            })
        }
    }
}

/// A document's text as the parser gets it.
pub(super) enum Input<'t, R> {
    /// All of it (the parser is faster on text).
    Text(&'t str),
    /// A reader, parsed as it is read (the text is never held).
    Reader(R),
}

/// The list header a parsed document's value names: a list kind and an `apiVersion`, both
/// strings; `None` when the document is not a list the loader unpacks.
pub(super) fn list_header(value: &Value) -> Option<ListHeader> {
    let map = value.as_object()?;
    let item_kind = list_item_kind(map.get("kind")?.as_str()?)?;
    let api_version = map.get("apiVersion")?.as_str()?;
    Some((item_kind, api_version.to_string()))
}

/// The parse's state: where the items go, and whether an item forced a second parse.
struct State<'l, 'a> {
    target: Target<'l, 'a>,
    restart: bool,
}

/// What the parse knows of the list when it reaches `items`.
enum Header {
    /// Nothing: `kind` comes later (or never).
    Unknown,
    /// A list kind: the kind its items default to (`""` for `List`), and its `apiVersion`
    /// when it came before `items`.
    List {
        item_kind: &'static str,
        api_version: Option<String>,
    },
}

impl State<'_, '_> {
    /// The header at `items`, from the keys read before it; `None` when `kind` was read and is
    /// not a list kind (the document is not a list: its `items` are kept as they are).
    fn header(&self, object: &serde_json::Map<String, Value>) -> Option<Header> {
        if let Some((item_kind, api_version)) = &self.target.known {
            return Some(Header::List {
                item_kind,
                api_version: Some(api_version.clone()),
            });
        }
        match object.get("kind") {
            None => Some(Header::Unknown),
            Some(Value::String(kind)) => list_item_kind(kind).map(|item_kind| Header::List {
                item_kind,
                api_version: object
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            }),
            Some(_) => None,
        }
    }

    /// Hands entry `index` of `items` to the loader, or starts over (see [`Items::Restart`]).
    fn item(&mut self, index: usize, item: serde_saphyr::Spanned<Value>, header: &Header) {
        if self.restart {
            return;
        }
        // The item kind and apiVersion the entry gets when it lacks its own (`add_value`'s
        // `list`); the outer `None`: they are needed and not known yet.
        let list = match header {
            Header::List {
                item_kind: "",
                api_version: _,
            } => Some(None),
            Header::List {
                item_kind,
                api_version: Some(api_version),
            } => Some(Some((*item_kind, api_version.as_str()))),
            _ if self_contained(&item.value) => Some(None),
            _ => None,
        };
        let Some(list) = list else {
            self.target.loader.undo_document();
            self.restart = true;
            return;
        };
        // The parser's lines are relative to the document's text.
        let line = match usize::try_from(item.referenced.line()) {
            Ok(l) if l > 0 => l - 1 + self.target.first_line,
            _ => self.target.at.line,
        };
        let at = At {
            file: self.target.at.file,
            line,
            label: format!("{} items[{index}]", self.target.at.label),
        };
        self.target.loader.add_value(&at, item.value, list);
    }
}

/// Whether an entry of `items` loads the same whatever list holds it: it names its own `kind`
/// and `apiVersion` (a list only fills in missing ones), or it is not a mapping.
fn self_contained(item: &Value) -> bool {
    match item {
        Value::Object(map) => map.contains_key("kind") && map.contains_key("apiVersion"),
        _ => true,
    }
}

/// Reads a document (see the module documentation).
struct DocumentSeed<'s, 'l, 'a> {
    state: &'s mut State<'l, 'a>,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_, '_, '_> {
    type Value = ParsedDocument;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<ParsedDocument, D::Error> {
        deserializer.deserialize_any(DocumentVisitor { state: self.state })
    }
}

/// A top-level mapping is read key by key (to hand its `items` over); anything else is handed
/// to [`Value`]'s own deserializer.
struct DocumentVisitor<'s, 'l, 'a> {
    state: &'s mut State<'l, 'a>,
}

fn plain<E>(value: Result<Value, E>) -> Result<ParsedDocument, E> {
    value.map(|value| ParsedDocument {
        value,
        items: Items::Kept,
    })
}

impl<'de> de::Visitor<'de> for DocumentVisitor<'_, '_, '_> {
    type Value = ParsedDocument;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML document")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<ParsedDocument, E> {
        plain(Value::deserialize(v.into_deserializer()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ParsedDocument, E> {
        plain(Value::deserialize(v.into_deserializer()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ParsedDocument, E> {
        plain(Value::deserialize(v.into_deserializer()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<ParsedDocument, E> {
        plain(Value::deserialize(v.into_deserializer()))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<ParsedDocument, E> {
        plain(Value::deserialize(v.into_deserializer()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<ParsedDocument, E> {
        plain(Value::deserialize(v.into_deserializer()))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ParsedDocument, E> {
        plain(Ok(Value::String(v.to_string())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<ParsedDocument, E> {
        plain(Ok(Value::String(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<ParsedDocument, E> {
        plain(Ok(Value::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<ParsedDocument, E> {
        plain(Ok(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<ParsedDocument, D::Error> {
        plain(Value::deserialize(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<ParsedDocument, D::Error> {
        plain(Value::deserialize(d))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<ParsedDocument, A::Error> {
        plain(Value::deserialize(de::value::SeqAccessDeserializer::new(
            seq,
        )))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<ParsedDocument, A::Error> {
        let mut object = serde_json::Map::new();
        let mut items = Items::Kept;
        while let Some(key) = map.next_key::<String>()? {
            let value = if key == "items" {
                let header = self.state.header(&object);
                let seed = ItemsSeed {
                    state: &mut *self.state,
                    header,
                };
                match map.next_value_seed(seed)? {
                    ItemsValue::Streamed => {
                        items = if self.state.restart {
                            Items::Restart
                        } else {
                            Items::Streamed
                        };
                        continue;
                    }
                    ItemsValue::Kept(value) => value,
                }
            } else {
                map.next_value::<Value>()?
            };
            object.insert(key, value);
        }
        Ok(ParsedDocument {
            value: Value::Object(object),
            items,
        })
    }
}

/// The value of a top-level `items` key, as [`ItemsSeed`] read it.
enum ItemsValue {
    /// A sequence, whose entries went to the loader.
    Streamed,
    /// Anything else (an error reported later, with the document's other problems), or a
    /// sequence of a document that is not a list.
    Kept(Value),
}

/// Reads a top-level `items` value: a sequence's entries go to the loader when `header` is
/// `Some` (the document may be a list), or are kept as a [`Value`] when it is `None`.
struct ItemsSeed<'s, 'l, 'a> {
    state: &'s mut State<'l, 'a>,
    header: Option<Header>,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_, '_, '_> {
    type Value = ItemsValue;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ItemsValue, D::Error> {
        deserializer.deserialize_any(self)
    }
}

fn kept<E>(value: Result<Value, E>) -> Result<ItemsValue, E> {
    value.map(ItemsValue::Kept)
}

impl<'de> de::Visitor<'de> for ItemsSeed<'_, '_, '_> {
    type Value = ItemsValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of objects")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<ItemsValue, E> {
        kept(Value::deserialize(v.into_deserializer()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ItemsValue, E> {
        kept(Value::deserialize(v.into_deserializer()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ItemsValue, E> {
        kept(Value::deserialize(v.into_deserializer()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<ItemsValue, E> {
        kept(Value::deserialize(v.into_deserializer()))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<ItemsValue, E> {
        kept(Value::deserialize(v.into_deserializer()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<ItemsValue, E> {
        kept(Value::deserialize(v.into_deserializer()))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ItemsValue, E> {
        kept(Ok(Value::String(v.to_string())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<ItemsValue, E> {
        kept(Ok(Value::String(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<ItemsValue, E> {
        kept(Ok(Value::Null))
    }

    fn visit_none<E: de::Error>(self) -> Result<ItemsValue, E> {
        kept(Ok(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<ItemsValue, D::Error> {
        self.deserialize(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<ItemsValue, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<ItemsValue, A::Error> {
        let Some(header) = self.header else {
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(item) = seq.next_element::<serde_saphyr::Spanned<Value>>()? {
                items.push(item.value);
            }
            return Ok(ItemsValue::Kept(Value::Array(items)));
        };
        let mut index = 0;
        while let Some(item) = seq.next_element::<serde_saphyr::Spanned<Value>>()? {
            self.state.item(index, item, &header);
            index += 1;
        }
        Ok(ItemsValue::Streamed)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ItemsValue, A::Error> {
        kept(Value::deserialize(de::value::MapAccessDeserializer::new(
            map,
        )))
    }
}

/// What a document seems to be, read without keeping it: its `kind`, its `metadata`, and how
/// many entries its `items` has. For the error of a document that is skipped whole.
#[derive(Default)]
pub(super) struct Outline {
    /// The top-level `kind`, when the document is a mapping that has one.
    pub(super) kind: Option<Value>,
    /// The top-level `metadata`.
    pub(super) metadata: Option<Value>,
    /// How many entries the top-level `items` has, when it is a sequence.
    pub(super) items: Option<usize>,
}

/// Reads a document's [`Outline`], parsing it as [`parse`] would (each value into a
/// [`Value`], dropped at once) so that it fails where the load fails.
pub(super) fn outline(
    text: &str,
    options: serde_saphyr::Options,
) -> Result<Outline, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options::<Outline>(text, options)
}

impl<'de> Deserialize<'de> for Outline {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(OutlineVisitor)
    }
}

struct OutlineVisitor;

/// The outline of a document read whole into a [`Value`] (a mapping behind a tag, say).
fn whole<E>(value: Result<Value, E>) -> Result<Outline, E> {
    value.map(|value| match value {
        Value::Object(mut map) => Outline {
            kind: map.remove("kind"),
            metadata: map.remove("metadata"),
            items: map.get("items").and_then(Value::as_array).map(Vec::len),
        },
        _ => Outline::default(),
    })
}

impl<'de> de::Visitor<'de> for OutlineVisitor {
    type Value = Outline;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML document")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<Outline, E> {
        Ok(Outline::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Outline, D::Error> {
        whole(Value::deserialize(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Outline, D::Error> {
        whole(Value::deserialize(d))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Outline, A::Error> {
        whole(Value::deserialize(de::value::SeqAccessDeserializer::new(
            seq,
        )))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Outline, A::Error> {
        let mut outline = Outline::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "items" => outline.items = map.next_value::<Count>()?.0,
                "kind" => outline.kind = Some(map.next_value()?),
                "metadata" => outline.metadata = Some(map.next_value()?),
                _ => drop(map.next_value::<Value>()?),
            }
        }
        Ok(outline)
    }
}

/// The number of entries of a sequence (each parsed into a [`Value`] and dropped); `None` for
/// anything else (parsed into a [`Value`] and dropped).
struct Count(Option<usize>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CountVisitor)
    }
}

struct CountVisitor;

fn not_counted<E>(value: Result<Value, E>) -> Result<Count, E> {
    value.map(|value| Count(value.as_array().map(Vec::len)))
}

impl<'de> de::Visitor<'de> for CountVisitor {
    type Value = Count;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of objects")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Count, E> {
        Ok(Count(None))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Count, E> {
        Ok(Count(None))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Count, E> {
        Ok(Count(None))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Count, E> {
        not_counted(Value::deserialize(v.into_deserializer()))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Count, E> {
        not_counted(Value::deserialize(v.into_deserializer()))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Count, E> {
        Ok(Count(None))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Count, E> {
        Ok(Count(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Count, E> {
        Ok(Count(None))
    }

    fn visit_none<E: de::Error>(self) -> Result<Count, E> {
        Ok(Count(None))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Count, D::Error> {
        Count::deserialize(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Count, D::Error> {
        Count::deserialize(d)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
        let mut count = 0;
        while seq
            .next_element::<serde_saphyr::Spanned<Value>>()?
            .is_some()
        {
            count += 1;
        }
        Ok(Count(Some(count)))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Count, A::Error> {
        not_counted(Value::deserialize(de::value::MapAccessDeserializer::new(
            map,
        )))
    }
}
