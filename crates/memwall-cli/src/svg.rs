//! The roofline plot as a self-contained SVG (log-log: arithmetic intensity vs attained FLOP/s).

use memwall_core::gpu::GpuSpec;
use memwall_core::roofline::{Bound, MathDtype, Roofline};
use std::fmt::Write as _;

const W: f64 = 900.0;
const H: f64 = 560.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 330.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn dtype_name(d: MathDtype) -> &'static str {
    match d {
        MathDtype::Fp64 => "fp64",
        MathDtype::Fp32 => "fp32",
        MathDtype::Tf32 => "tf32",
        MathDtype::Bf16 => "bf16",
        MathDtype::Fp16 => "fp16",
        MathDtype::Fp8 => "fp8",
        MathDtype::Int8 => "int8",
    }
}

/// Renders the roofline of `gpu` with the ops of `r` as points.
pub fn roofline_svg(r: &Roofline, gpu: &GpuSpec, title: &str) -> String {
    let bw = gpu.memory_bandwidth_bytes_per_s;
    let peak_max = gpu
        .peak_flops_per_s
        .iter()
        .map(|(_, f)| *f)
        .fold(1.0, f64::max);
    let (x0, x1) = (1e-2f64.log10(), 1e4f64.log10());
    let (y0, y1) = (
        (bw * 1e-2 / 10.0).log10().floor(),
        (peak_max * 2.0).log10().ceil(),
    );
    let px = |x: f64| LEFT + (x.max(1e-300).log10() - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    let py = |y: f64| H - BOTTOM - (y.max(1e-300).log10() - y0) / (y1 - y0) * (H - TOP - BOTTOM);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="28" font-size="16" font-weight="bold">{}</text>"#,
        esc(title)
    );
    // grid and decade ticks
    for e in (x0 as i32)..=(x1 as i32) {
        let x = px(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/>"##,
            H - BOTTOM
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">1e{e}</text>"#,
            H - BOTTOM + 16.0
        );
    }
    for e in (y0 as i32)..=(y1 as i32) {
        let y = py(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/>"##,
            W - RIGHT
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">1e{e}</text>"#,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">arithmetic intensity (FLOP/byte)</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">attained FLOP/s</text>"#,
        (TOP + H - BOTTOM) / 2.0
    );
    // compute ceilings (formats with the same peak share one line) and the bandwidth slope
    let colors = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    ];
    let mut ceilings: Vec<(f64, Vec<&str>)> = Vec::new();
    for (d, peak) in &gpu.peak_flops_per_s {
        match ceilings
            .iter_mut()
            .find(|(p, _)| (p - peak).abs() <= 1e-6 * peak)
        {
            Some((_, names)) => names.push(dtype_name(*d)),
            None => ceilings.push((*peak, vec![dtype_name(*d)])),
        }
    }
    for (i, (peak, names)) in ceilings.iter().enumerate() {
        let ridge = peak / bw;
        let c = colors[i % colors.len()];
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{c}" stroke-width="2"/>"#,
            px(ridge),
            py(*peak),
            W - RIGHT,
            py(*peak)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" fill="{c}">{} {:.0} TFLOP/s (ridge {:.0})</text>"#,
            W - RIGHT + 6.0,
            py(*peak) + 4.0,
            names.join("/"),
            peak / 1e12,
            ridge
        );
    }
    let xs = 10f64.powf(x0);
    let xe = peak_max / bw;
    let _ = writeln!(
        s,
        r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black" stroke-width="2.5"/>"#,
        px(xs),
        py(bw * xs),
        px(xe),
        py(bw * xe)
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" transform="rotate(-31 {:.1} {:.1})">HBM {:.2} TB/s</text>"#,
        px(xs * 8.0),
        py(bw * xs * 8.0) - 8.0,
        px(xs * 8.0),
        py(bw * xs * 8.0) - 8.0,
        bw / 1e12
    );
    // ops: numbered points, named in a legend on the right
    let ops: Vec<_> = r
        .ops
        .iter()
        .filter(|o| o.bound != Bound::Network && o.flops > 0.0)
        .collect();
    let legend_top = py(ceilings
        .iter()
        .map(|(p, _)| *p)
        .fold(f64::INFINITY, f64::min))
        + 30.0;
    for (i, o) in ops.iter().enumerate() {
        let attained = o.flops / o.time_s.max(1e-300);
        let (x, y) = (px(o.intensity), py(attained));
        let fill = if o.bound == Bound::Memory {
            "#d62728"
        } else {
            "#2ca02c"
        };
        let _ = writeln!(
            s,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="7" fill="{fill}" fill-opacity="0.75"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" font-size="9" fill="white" text-anchor="middle" font-weight="bold">{}</text>"#,
            y + 3.0,
            i + 1
        );
        let ly = legend_top + 15.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{ly:.1}" font-size="11"><tspan fill="{fill}" font-weight="bold">{}</tspan> {} — {:.1} FLOP/B</text>"#,
            W - RIGHT + 10.0,
            i + 1,
            esc(&o.name),
            o.intensity
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" font-size="11"><tspan fill="#d62728">● memory-bound</tspan>  <tspan fill="#2ca02c">● compute-bound</tspan></text>"##,
        LEFT,
        TOP - 6.0
    );
    s.push_str("</svg>\n");
    s
}
