//! The gateway's upstream path templates. Input: the template on the first line, then one
//! argument a line, `name<TAB>value`, where a value that parses as JSON is that JSON and any
//! other text is a string (`id<TAB>..` is the string `..`, `id<TAB>7` the number 7).
//!
//! A template that parses renders to an error or to a path in which the arguments added no
//! `/`, `?` or `#`, and no dot-segment (`.` or `..`, `%2e` counting as a dot) that the
//! template did not hold literally: an agent's argument must not steer the call to another
//! upstream path. A segment with a placeholder in it is never literal, so `/.{x}` rendered with
//! an empty `x` counts too.

#![no_main]

use gateway::config::PathTemplate;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

/// A template character: literal text, or where a placeholder stood.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Literal(char),
    Placeholder,
}

/// `/items/{id}/x` → `/items/` `{}` `/x`, as `PathTemplate::parse` reads placeholders.
fn parts(template: &str) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = open
            + rest[open..]
                .find('}')
                .expect("a parsed template closes its {");
        parts.extend(rest[..open].chars().map(Part::Literal));
        parts.push(Part::Placeholder);
        rest = &rest[close + 1..];
    }
    parts.extend(rest.chars().map(Part::Literal));
    parts
}

fn is_dot_segment(segment: &str) -> bool {
    let decoded = segment.replace("%2e", ".").replace("%2E", ".");
    decoded == "." || decoded == ".."
}

fn structural(c: char) -> bool {
    matches!(c, '/' | '?' | '#')
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let mut lines = text.split('\n');
    let template = lines.next().unwrap_or_default();
    let mut args = Map::new();
    for line in lines {
        let (name, value) = line.split_once('\t').unwrap_or((line, ""));
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::from(value));
        args.insert(name.to_owned(), value);
    }
    let Ok(parsed) = PathTemplate::parse(template) else {
        return;
    };
    let mut path = String::new();
    if parsed.render(&Value::Object(args), &mut path).is_err() {
        return;
    }
    let parts = parts(template);
    // The template's '/', '?' and '#' and no others, in order.
    let literal = parts.iter().filter_map(|p| match p {
        Part::Literal(c) if structural(*c) => Some(*c),
        _ => None,
    });
    assert!(
        path.chars().filter(|&c| structural(c)).eq(literal),
        "an argument added a '/', '?' or '#': {template:?} → {path:?}"
    );
    // So the path's segments are the template's, one for one, up to the query or fragment.
    let path_end = path.find(['?', '#']).unwrap_or(path.len());
    let template_end = (parts.iter())
        .position(|p| matches!(p, Part::Literal('?' | '#')))
        .unwrap_or(parts.len());
    let segments = parts[..template_end].split(|p| *p == Part::Literal('/'));
    for (rendered, source) in path[..path_end].split('/').zip(segments) {
        if !is_dot_segment(rendered) {
            continue;
        }
        let literal: Option<String> = (source.iter())
            .map(|p| match p {
                Part::Literal(c) => Some(*c),
                Part::Placeholder => None,
            })
            .collect();
        assert_eq!(
            literal.as_deref(),
            Some(rendered),
            "an argument made the dot-segment {rendered:?}: {template:?} → {path:?}"
        );
    }
});
