//! Any bytes as a session request, a plan reply, or a data or finish
//! answer: decoding never panics, and what decodes re-encodes to the same
//! bytes' meaning. A data header that decodes is checked against file
//! sizes taken from the input and, if it passes, laid out (a framed one
//! with its frames).
#![no_main]
use atou::fuzzing::transfer::layout::Layout;
use atou::fuzzing::transfer::messages::{encode_abort, DataHeader, Outcome, PlanReply, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    match pick % 4 {
        0 => match Request::decode(rest) {
            Ok(Request::Plan(p)) => {
                assert_eq!(Request::decode(&p.encode()).unwrap(), Request::Plan(p));
            }
            Ok(Request::Data(h)) => {
                assert_eq!(DataHeader::parse(&h.encode()).unwrap().unwrap().0, h)
            }
            Ok(Request::Abort(why)) => {
                let again = Request::decode(&encode_abort(&why)).unwrap();
                assert_eq!(again, Request::Abort(why));
            }
            Ok(Request::Finish(_)) | Err(_) => {}
        },
        1 => {
            // Sizes from the first bytes, a plan reply from the rest.
            let sizes: Vec<u64> = rest.iter().take(3).map(|&b| u64::from(b) << 18).collect();
            let body = rest.get(3..).unwrap_or_default();
            // Whether the plan asked for --delete (a list of deletions
            // follows) from the parity of the first byte.
            let delete = rest.first().is_some_and(|b| b & 1 == 1);
            if let Ok(r) = PlanReply::decode(body, &sizes, delete) {
                assert_eq!(PlanReply::decode(&r.encode(), &sizes, delete).unwrap(), r);
            }
        }
        2 => {
            if let Ok(o) = Outcome::decode(rest) {
                assert_eq!(Outcome::decode(&o.encode()).unwrap(), o);
            }
        }
        _ => {
            let sizes: Vec<u64> = rest.iter().take(4).map(|&b| u64::from(b) << 19).collect();
            let body = rest.get(4..).unwrap_or_default();
            // A framed header (`--compress`, kind `Z`) as the receiver
            // reads one: its frames checked against the chunks' lengths.
            let parsed = if body.first() == Some(&b'Z') {
                DataHeader::parse_framed(body).map(|h| h.map(|(h, f, _)| (h, Some(f))))
            } else {
                DataHeader::parse(body).map(|h| h.map(|(h, _)| (h, None)))
            };
            if let Ok(Some((h, frames))) = parsed {
                if h.check(&sizes).is_ok() {
                    let layout = match frames {
                        None => Layout::new(&h, &sizes),
                        Some(f) => match Layout::framed(&h, &f, &sizes) {
                            Ok(layout) => layout,
                            Err(_) => return,
                        },
                    };
                    if let Some(last) = layout.slots.last() {
                        assert_eq!(layout.slot_at(last.offset), Some(layout.slots.len() - 1));
                    }
                }
            }
        }
    }
});
