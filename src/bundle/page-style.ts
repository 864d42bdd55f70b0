// The one stylesheet of forge's static pages (report.html, bisect.html): laid out for a laptop
// screen (1280 px), a verdict card on top, tables that wrap rather than scroll sideways.
// `td.name` marks cells of long names (ops, tensors) that may break anywhere.
export const PAGE_CSS = 'body{font-family:sans-serif;margin:1.5em auto;max-width:76em;padding:0 1.5em;line-height:1.35}'
  + 'h1{font-size:1.5em;margin:.2em 0 .6em}h2{font-size:1.15em;margin-top:1.6em}'
  + 'table{border-collapse:collapse;margin:.6em 0;max-width:100%}td,th{border:1px solid #ccc;padding:.25em .5em;font-size:.9em;text-align:left;vertical-align:top;overflow-wrap:break-word}th{background:#f4f4f4}'
  + 'td.name{overflow-wrap:anywhere}td.fail{color:#b00;font-weight:bold}td.ok{color:#070;font-weight:bold}.ok{color:#070}.bad{color:#b00}svg{max-width:100%;height:auto}'
  + '.card{border:2px solid;border-radius:8px;padding:.6em 1em;margin:0 0 1em}.card table{width:100%;background:#fff;margin:.4em 0 .2em}.card p{margin:.4em 0}'
  + '.card.pass{border-color:#2a8a2a;background:#f3fbf3}.card.fail{border-color:#c22;background:#fdf3f3}.card.partial,.card.fixed{border-color:#b80;background:#fdf9ef}'
  + '.headline{font-size:1.1em}.muted{color:#666;font-size:.85em}'
  + '.verdict{display:inline-block;font-weight:bold;color:#fff;border-radius:4px;padding:.05em .5em;margin-right:.4em}.pass .verdict{background:#2a8a2a}.fail .verdict{background:#c22}.partial .verdict,.fixed .verdict{background:#b80}';
