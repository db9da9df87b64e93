/**
 * `--help` for the scripts whose usage is their module comment: prints that comment (the leading
 * `/** … *\/` block or `//` lines of the file) and exits 0 when the command line asks for help.
 *
 *   import { helpFromComment } from "./help.ts";
 *   helpFromComment(import.meta.url); // first statement after the imports
 */

/** The leading comment of `source` (a doc block or `//` lines), without its comment marks. */
export function leadingComment(source: string): string {
  const text = source.trimStart();
  if (text.startsWith("/**")) {
    const body = text.slice(3, text.indexOf("*/"));
    return body.split("\n").map((l) => l.replace(/^\s*\* ?/, "")).join("\n").trim();
  }
  const lines: string[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith("//")) break;
    lines.push(line.replace(/^\/\/ ?/, ""));
  }
  return lines.join("\n").trim();
}

/** Prints the module's leading comment and exits when `args` hold `-h` or `--help`. */
export function helpFromComment(moduleUrl: string, args: readonly string[] = Deno.args): void {
  if (!args.includes("--help") && !args.includes("-h")) return;
  console.log(leadingComment(Deno.readTextFileSync(new URL(moduleUrl))));
  Deno.exit(0);
}
