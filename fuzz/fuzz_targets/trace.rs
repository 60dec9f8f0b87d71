//! `atou plot`'s input: a trace file. Reading never panics; every record
//! read prints to a line that reads again; and whatever reads draws
//! without panicking (no overflow in the series or in the picture's
//! coordinates, whatever the numbers).
#![no_main]
use atou::fuzzing::plot::{svg, title, Series};
use atou::fuzzing::trace::{parse_record, Trace};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(trace) = Trace::parse(text) else {
        return;
    };
    for r in &trace.records {
        let line = r.to_string();
        assert!(
            matches!(parse_record(&line), Ok(Some(_))),
            "`{line}` does not read back"
        );
    }
    let series = Series::from_trace(&trace);
    let _ = svg(&series, &title(&trace));
});
