//! The one template parser of the sidecar: `${token}` templates that name
//! the claim and its volume, split as Go's `os.Expand` splits them.
//!
//! Two readers share it:
//!
//! - secret templates ([`super::secrets`]) read it as upstream does
//!   (`os.Expand`: also `$name` without braces, bad syntax eaten);
//! - StorageClass parameter templates ([`super::claim_metadata`], gate
//!   `ClaimMetadataPropagation`) read it strictly: only `${token}` and `$$`
//!   (a literal `$`), anything else is a malformed template.
//!
//! Secret templates know upstream's tokens ([`parse_token`]): `${pv.name}`,
//! `${pvc.name}`, `${pvc.namespace}`, `${pvc.annotations['KEY']}`.
//! Parameter templates know those and `${pvc.labels['KEY']}`
//! ([`parse_parameter_token`]); secret templates keep upstream's set, so a
//! class means the same to both images there.

/// What the templates may refer to. At deletion time only the claim's name
/// and namespace from the PV's claimRef are known, so `annotations` is empty
/// and annotation tokens fail, as upstream.
#[derive(Clone, Copy, Debug)]
pub struct TemplateContext<'a> {
    pub pv_name: &'a str,
    pub pvc_name: &'a str,
    pub pvc_namespace: &'a str,
    pub pvc_annotations: Option<&'a crate::projection::Map>,
    /// Read only by parameter templates (`${pvc.labels['KEY']}`).
    pub pvc_labels: Option<&'a crate::projection::Map>,
}

/// A token of a template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token<'a> {
    /// `pv.name`: the PV (and CSI volume) name.
    PvName,
    /// `pvc.name`.
    PvcName,
    /// `pvc.namespace`.
    PvcNamespace,
    /// `pvc.annotations['KEY']`: the value of the claim's annotation `KEY`.
    PvcAnnotation(&'a str),
    /// `pvc.labels['KEY']`: the value of the claim's label `KEY` (parameter
    /// templates only).
    PvcLabel(&'a str),
}

/// The tokens of parameter templates, as a user writes them (for error
/// messages).
pub const PARAMETER_TOKENS: &str =
    "${pv.name}, ${pvc.name}, ${pvc.namespace}, ${pvc.annotations['KEY']}, ${pvc.labels['KEY']}";

impl Token<'_> {
    /// Whether the claim's user cannot choose the value: only these may
    /// pick the namespace a Secret is read from.
    pub fn outside_claim_users_control(self) -> bool {
        matches!(self, Token::PvName | Token::PvcNamespace)
    }
}

/// The token of a secret template a name between `${` and `}` stands for,
/// if any (upstream's set).
pub fn parse_token(name: &str) -> Option<Token<'_>> {
    match name {
        "pv.name" => Some(Token::PvName),
        "pvc.name" => Some(Token::PvcName),
        "pvc.namespace" => Some(Token::PvcNamespace),
        _ => indexed(name, "pvc.annotations").map(Token::PvcAnnotation),
    }
}

/// The token of a parameter template a name stands for, if any: the
/// secret templates' and `pvc.labels['KEY']`.
pub fn parse_parameter_token(name: &str) -> Option<Token<'_>> {
    parse_token(name).or_else(|| indexed(name, "pvc.labels").map(Token::PvcLabel))
}

/// `KEY` of `<map>['KEY']`, when not empty.
fn indexed<'a>(name: &'a str, map: &str) -> Option<&'a str> {
    name.strip_prefix(map)?
        .strip_prefix("['")?
        .strip_suffix("']")
        .filter(|key| !key.is_empty())
}

impl TemplateContext<'_> {
    /// The value of `token`; `None` for an annotation or label the claim
    /// does not have (or when they are not known).
    pub fn value(&self, token: Token<'_>) -> Option<&str> {
        match token {
            Token::PvName => Some(self.pv_name),
            Token::PvcName => Some(self.pvc_name),
            Token::PvcNamespace => Some(self.pvc_namespace),
            Token::PvcAnnotation(key) => self.pvc_annotations?.get(key).map(|value| value.as_str()),
            Token::PvcLabel(key) => self.pvc_labels?.get(key).map(|value| value.as_str()),
        }
    }
}

/// One piece of a template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Text that stays as it is.
    Literal(&'a str),
    /// `${name}` (`braced`) or `$name`: a shell name, or one of Go's
    /// one-character special names (`$$`, `$1`, `$*`, ...).
    Token { name: &'a str, braced: bool },
    /// A `$` followed by no name (or at the end): `os.Expand` keeps it.
    LoneDollar,
    /// `${}`: `os.Expand` drops it.
    EmptyBraces,
    /// `${` without a closing `}`: `os.Expand` drops the `${`.
    Unterminated,
}

/// Splits a template as Go's `os.Expand` does.
pub fn pieces(template: &str) -> Vec<Piece<'_>> {
    let bytes = template.as_bytes();
    let mut out = Vec::new();
    let mut literal_start = 0;
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] != b'$' {
            index += 1;
            continue;
        }
        if literal_start < index {
            out.push(Piece::Literal(&template[literal_start..index]));
        }
        if index + 1 == bytes.len() {
            // A trailing `$`: os.Expand leaves it.
            out.push(Piece::LoneDollar);
            index += 1;
            literal_start = index;
            continue;
        }
        let (piece, width) = shell_name(&template[index + 1..]);
        out.push(piece);
        index += width + 1;
        literal_start = index;
    }
    if literal_start < bytes.len() {
        out.push(Piece::Literal(&template[literal_start..]));
    }
    out
}

/// Go's `getShellName`: what follows a `$` (never empty) and the bytes it
/// spans after the `$`.
fn shell_name(rest: &str) -> (Piece<'_>, usize) {
    let bytes = rest.as_bytes();
    let is_special = |b: u8| b"*#$@!?-".contains(&b) || b.is_ascii_digit();
    if bytes[0] == b'{' {
        if bytes.len() > 2 && is_special(bytes[1]) && bytes[2] == b'}' {
            let name = &rest[1..2];
            return (Piece::Token { name, braced: true }, 3);
        }
        return match rest[1..].find('}') {
            Some(0) => (Piece::EmptyBraces, 2),
            Some(end) => {
                let name = &rest[1..=end];
                (Piece::Token { name, braced: true }, end + 2)
            }
            None => (Piece::Unterminated, 1),
        };
    }
    if is_special(bytes[0]) {
        let name = &rest[..1];
        return (
            Piece::Token {
                name,
                braced: false,
            },
            1,
        );
    }
    let len = bytes
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
        .count();
    if len == 0 {
        (Piece::LoneDollar, 0)
    } else {
        let name = &rest[..len];
        (
            Piece::Token {
                name,
                braced: false,
            },
            len,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str) -> Piece<'_> {
        Piece::Token { name, braced: true }
    }

    fn bare(name: &str) -> Piece<'_> {
        Piece::Token {
            name,
            braced: false,
        }
    }

    #[test]
    fn splits_as_os_expand() {
        use Piece::*;
        let cases: &[(&str, &[Piece<'_>])] = &[
            ("", &[]),
            ("plain", &[Literal("plain")]),
            ("${pvc.name}", &[token("pvc.name")]),
            (
                "a/${pvc.namespace}/${pvc.name}-b",
                &[
                    Literal("a/"),
                    token("pvc.namespace"),
                    Literal("/"),
                    token("pvc.name"),
                    Literal("-b"),
                ],
            ),
            ("$name.x", &[bare("name"), Literal(".x")]),
            ("$$", &[bare("$")]),
            ("$${x}", &[bare("$"), Literal("{x}")]),
            ("${$}", &[token("$")]),
            ("$1", &[bare("1")]),
            ("a$", &[Literal("a"), LoneDollar]),
            ("a$.b", &[Literal("a"), LoneDollar, Literal(".b")]),
            ("${}x", &[EmptyBraces, Literal("x")]),
            ("a${", &[Literal("a"), Unterminated]),
            ("a${b", &[Literal("a"), Unterminated, Literal("b")]),
            (
                "${pvc.annotations['a/b']}",
                &[token("pvc.annotations['a/b']")],
            ),
        ];
        for (template, want) in cases {
            assert_eq!(pieces(template), *want, "{template:?}");
        }
    }

    #[test]
    fn tokens() {
        let cases = [
            ("pv.name", Some(Token::PvName)),
            ("pvc.name", Some(Token::PvcName)),
            ("pvc.namespace", Some(Token::PvcNamespace)),
            (
                "pvc.annotations['example.com/cost-center']",
                Some(Token::PvcAnnotation("example.com/cost-center")),
            ),
            ("pvc.annotations['']", None),
            ("pvc.annotations[\"k\"]", None),
            ("pvc.annotations['k'", None),
            ("pvc.metadata.name", None),
            ("pvc.labels['k']", None),
            ("PVC.NAME", None),
            ("", None),
        ];
        for (name, want) in cases {
            assert_eq!(parse_token(name), want, "{name:?}");
        }
    }

    /// Parameter templates know the secret templates' tokens and labels.
    #[test]
    fn parameter_tokens() {
        let cases = [
            ("pv.name", Some(Token::PvName)),
            ("pvc.name", Some(Token::PvcName)),
            ("pvc.namespace", Some(Token::PvcNamespace)),
            ("pvc.annotations['a/b']", Some(Token::PvcAnnotation("a/b"))),
            ("pvc.labels['team']", Some(Token::PvcLabel("team"))),
            (
                "pvc.labels['example.com/tier']",
                Some(Token::PvcLabel("example.com/tier")),
            ),
            ("pvc.labels['']", None),
            ("pvc.labels[\"team\"]", None),
            ("pvc.labels['team'", None),
            ("pvc.labels", None),
            ("pvc.labelsx['team']", None),
            ("pvc.metadata.labels['team']", None),
            ("pvc.uid", None),
        ];
        for (name, want) in cases {
            assert_eq!(parse_parameter_token(name), want, "{name:?}");
        }
    }

    #[test]
    fn values() {
        let annotations = crate::projection::Map::from([("k".to_owned(), "v".to_owned())]);
        let labels = crate::projection::Map::from([("team".to_owned(), "a".to_owned())]);
        let context = TemplateContext {
            pv_name: "pvc-1",
            pvc_name: "data",
            pvc_namespace: "ns",
            pvc_annotations: Some(&annotations),
            pvc_labels: Some(&labels),
        };
        assert_eq!(context.value(Token::PvName), Some("pvc-1"));
        assert_eq!(context.value(Token::PvcName), Some("data"));
        assert_eq!(context.value(Token::PvcNamespace), Some("ns"));
        assert_eq!(context.value(Token::PvcAnnotation("k")), Some("v"));
        assert_eq!(context.value(Token::PvcAnnotation("x")), None);
        assert_eq!(context.value(Token::PvcLabel("team")), Some("a"));
        assert_eq!(context.value(Token::PvcLabel("k")), None, "labels only");
        assert_eq!(context.value(Token::PvcAnnotation("team")), None);
        let deletion = TemplateContext {
            pvc_annotations: None,
            pvc_labels: None,
            ..context
        };
        assert_eq!(deletion.value(Token::PvcAnnotation("k")), None);
        assert_eq!(deletion.value(Token::PvcLabel("team")), None);
    }
}
