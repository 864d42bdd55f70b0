// Bytes and times for people, written one way everywhere: decimal units (1 MB = 10^6 bytes, as file
// managers and the QNN tools print sizes).

/** Always in MB with one decimal: tables and messages that put sizes side by side (a twin's 0.5 MB context beside its ceiling). */
export const mb = (b: number): string => `${(b / 1e6).toFixed(1)} MB`;

/** GB with two decimals from 1 GB up, MB with one below: memory figures (budgets, peaks, predictions). */
export const formatBytes = (b: number): string => (Math.abs(b) >= 1e9 ? `${(b / 1e9).toFixed(2)} GB` : mb(b));

/** GB, MB, or kB for a twin's small files: the model card's sizes. */
export const sizeText = (b: number): string => (b >= 1e6 ? formatBytes(b) : `${(b / 1e3).toFixed(1)} kB`);

/** A stage's time: "12.3 s", or "12.3 s, after 40.0 s queued" when it waited for a slot or a lock first. */
export const took = (seconds: number, queued = 0): string => `${seconds.toFixed(1)} s${queued >= 0.05 ? `, after ${queued.toFixed(1)} s queued` : ''}`;
