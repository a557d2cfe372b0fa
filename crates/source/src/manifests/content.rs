//! A file's content as the loader reads it: split into YAML documents, with the bytes that
//! are not UTF-8 located, and each document read on its own, so that a large file is never
//! held whole.
//!
//! [`scan`] reads the content once, a line at a time: it finds the documents (split on
//! document-marker lines: `---`, `--- ...`, `...`) and the runs of bytes that are not UTF-8,
//! and keeps only where they are. The loader then reads each document again through
//! [`Content::document`]: from the buffer it was given
//! ([`ManifestLoader::add_text`](super::ManifestLoader::add_text),
//! [`ManifestLoader::add_bytes`](super::ManifestLoader::add_bytes)), or from the file itself,
//! 64 KiB at a time. A document longer than [`STREAM_ABOVE`](super::STREAM_ABOVE) (1 MiB) is
//! parsed as it is read; a shorter one is read into memory and parsed from text, which is
//! faster. So a `kind: List` of 10,000 Services (37 MB) costs no more memory to load than the
//! same objects in many files. A file no longer than that limit is read whole, as before.
//! (A file that is one long line, minified JSON, is held as that line while it is scanned.)
//!
//! A file written while it is loaded may be read half old and half new, as it could be when
//! it was read whole; the watcher reads it again once it has stopped changing
//! ([`crate::watch`]).

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};

/// One YAML document of a file: where it is, and where its lines are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Document {
    /// Byte offsets of the document in the content (including a `--- ` marker line when
    /// content follows the marker): `start..end`.
    pub(super) start: usize,
    pub(super) end: usize,
    /// 1-based line of the document's first line in the file.
    pub(super) first_line: usize,
    /// 1-based line of its first line that is not blank or a comment (what errors report).
    pub(super) start_line: usize,
    /// 1-based number of the document among the file's non-empty documents.
    pub(super) number: usize,
}

impl Document {
    /// The document's length in bytes.
    pub(super) fn len(&self) -> usize {
        self.end - self.start
    }
}

/// A run of bytes that are not UTF-8 (what `String::from_utf8_lossy` replaces by one U+FFFD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BadBytes {
    /// Byte offset of the run in the content.
    pub(super) offset: usize,
    /// 1-based line of the file where the run is.
    pub(super) line: usize,
    /// The run's first byte.
    pub(super) byte: u8,
}

/// What [`scan`] found: the non-empty documents, in order, and the runs of bytes that are not
/// UTF-8, by offset.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Scan {
    pub(super) documents: Vec<Document>,
    pub(super) bad: Vec<BadBytes>,
}

/// A UTF-8 byte order mark, skipped at the start of a file.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Reads `input` a line at a time and returns its documents and its runs of bytes that are
/// not UTF-8. A leading byte order mark is not part of the first document. Lines are read as
/// `String::from_utf8_lossy` shows them: a run of bad bytes never holds a line feed, so the
/// lines and the document markers are where they are in the text.
pub(super) fn scan(input: &mut impl BufRead) -> io::Result<Scan> {
    struct Chunk {
        start: usize,
        first_line: usize,
        start_line: Option<usize>,
    }
    fn finish(chunk: &Chunk, end: usize, docs: &mut Vec<Document>) {
        if let Some(start_line) = chunk.start_line {
            let number = docs.len() + 1;
            docs.push(Document {
                start: chunk.start,
                end,
                first_line: chunk.first_line,
                start_line,
                number,
            });
        }
    }
    let mut found = Scan::default();
    let mut chunk = Chunk {
        start: 0,
        first_line: 1,
        start_line: None,
    };
    let mut offset = 0;
    let mut raw = Vec::new();
    let mut line_no = 0;
    loop {
        raw.clear();
        if input.read_until(b'\n', &mut raw)? == 0 {
            break;
        }
        line_no += 1;
        let mut bytes = raw.as_slice();
        if line_no == 1
            && let Some(rest) = bytes.strip_prefix(BOM)
        {
            bytes = rest;
            offset = BOM.len();
            chunk.start = offset;
        }
        let next = offset + bytes.len();
        let text = String::from_utf8_lossy(bytes);
        if let Cow::Owned(_) = text {
            let mut at = offset;
            for piece in bytes.utf8_chunks() {
                at += piece.valid().len();
                if let Some(&byte) = piece.invalid().first() {
                    found.bad.push(BadBytes {
                        offset: at,
                        line: line_no,
                        byte,
                    });
                }
                at += piece.invalid().len();
            }
        }
        let line = text.trim_end_matches(['\n', '\r']);
        if is_document_start(line) {
            finish(&chunk, offset, &mut found.documents);
            let rest = line[3..].trim();
            chunk = if rest.is_empty() || rest.starts_with('#') {
                Chunk {
                    start: next,
                    first_line: line_no + 1,
                    start_line: None,
                }
            } else {
                // Content on the marker line (`--- {a: 1}`, `--- !tag`): keep the marker.
                Chunk {
                    start: offset,
                    first_line: line_no,
                    start_line: Some(line_no),
                }
            };
        } else if is_document_end(line) {
            finish(&chunk, offset, &mut found.documents);
            chunk = Chunk {
                start: next,
                first_line: line_no + 1,
                start_line: None,
            };
        } else if chunk.start_line.is_none() && !is_blank(line) {
            chunk.start_line = Some(line_no);
        }
        offset = next;
    }
    finish(&chunk, offset, &mut found.documents);
    Ok(found)
}

/// Whether a line starts a document (`---`, optionally followed by a space and content).
fn is_document_start(line: &str) -> bool {
    line == "---" || line.starts_with("--- ") || line.starts_with("---\t")
}

/// Whether a line ends a document (`...`, optionally followed by a comment).
fn is_document_end(line: &str) -> bool {
    line == "..." || line.starts_with("... ") || line.starts_with("...\t")
}

/// Whether a line carries no content: blank, a comment, or a directive (`%YAML 1.2`).
fn is_blank(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#') || line.starts_with('%')
}

/// Where a file's content is read from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Content<'a> {
    /// A buffer holding all of it.
    Bytes(&'a [u8]),
    /// The open file, read again for each document.
    File(&'a File),
}

/// The bytes of one document, as [`Content::document`] reads them.
pub(super) enum DocumentReader<'a> {
    /// From a buffer.
    Bytes(&'a [u8]),
    /// From the file, 64 KiB at a time.
    File(BufReader<io::Take<&'a File>>),
}

impl Read for DocumentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            DocumentReader::Bytes(bytes) => bytes.read(buf),
            DocumentReader::File(file) => file.read(buf),
        }
    }
}

impl<'a> Content<'a> {
    /// A reader of `doc`'s bytes.
    pub(super) fn document(self, doc: &Document) -> io::Result<DocumentReader<'a>> {
        match self {
            Content::Bytes(bytes) => {
                let end = doc.end.min(bytes.len());
                Ok(DocumentReader::Bytes(&bytes[doc.start.min(end)..end]))
            }
            Content::File(mut file) => {
                file.seek(SeekFrom::Start(doc.start as u64))?;
                Ok(DocumentReader::File(BufReader::with_capacity(
                    64 * 1024,
                    file.take(doc.len() as u64),
                )))
            }
        }
    }

    /// `doc`'s bytes, read into memory (for a document that is skipped: only to say what it
    /// is).
    pub(super) fn document_bytes(self, doc: &Document) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.document(doc)?.read_to_end(&mut bytes)?;
        Ok(bytes)
    }
}

/// A reader that remembers the first error it returned, so that a read error is told apart
/// from the parser's own errors.
pub(super) struct Checked<R> {
    inner: R,
    /// The first read error, as text.
    pub(super) error: Option<String>,
}

impl<R> Checked<R> {
    pub(super) fn new(inner: R) -> Self {
        Checked { inner, error: None }
    }
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let result = self.inner.read(buf);
        if let Err(e) = &result
            && e.kind() != io::ErrorKind::Interrupted
            && self.error.is_none()
        {
            self.error = Some(e.to_string());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documents(text: &[u8]) -> Vec<(usize, usize, usize, usize)> {
        scan(&mut &text[..])
            .unwrap()
            .documents
            .iter()
            .map(|d| (d.start, d.end, d.first_line, d.start_line))
            .collect()
    }

    #[test]
    fn documents_and_bad_bytes_are_found_by_offset() {
        let text = b"# c\n---\na: 1\n--- {b: 2}\n...\n\n--- # x\n\xEF\xBB\xBFc: \xff\xfe3\r\n";
        assert_eq!(
            documents(text),
            [(8, 13, 3, 3), (13, 24, 4, 4), (37, text.len(), 8, 8)]
        );
        let found = scan(&mut &text[..]).unwrap();
        assert_eq!(
            found.bad,
            [
                BadBytes {
                    offset: 43,
                    line: 8,
                    byte: 0xff
                },
                BadBytes {
                    offset: 44,
                    line: 8,
                    byte: 0xfe
                }
            ]
        );
        // A byte order mark at the start is skipped; the lines stay.
        assert_eq!(documents(b"\xEF\xBB\xBFa: 1\n"), [(3, 8, 1, 1)]);
        assert_eq!(documents(b""), []);
        assert_eq!(documents(b"---\n# only\n"), []);
    }

    #[test]
    fn a_document_is_read_from_a_buffer_or_from_the_file() {
        let text = b"a: 1\n---\nbb: 22\n";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.yaml");
        std::fs::write(&path, text).unwrap();
        let file = File::open(&path).unwrap();
        let found = scan(&mut BufReader::new(&file)).unwrap();
        for content in [Content::Bytes(text), Content::File(&file)] {
            let read: Vec<Vec<u8>> = found
                .documents
                .iter()
                .map(|d| content.document_bytes(d).unwrap())
                .collect();
            assert_eq!(read, [b"a: 1\n".to_vec(), b"bb: 22\n".to_vec()]);
        }
    }
}
