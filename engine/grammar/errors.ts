/**
 * The one error type of constrained decoding: a grammar, schema or pattern the compiler refuses,
 * with the place in the request that caused it. Routes answer it with a 400.
 */

/**
 * A refused grammar. `message` starts with `path` and says what to do about it, e.g.
 * `response_format.json_schema.schema.properties.tags: 'uniqueItems' is not supported; remove it
 * and deduplicate after generation`.
 */
export class GrammarError extends Error {
  /** Where in the request (dotted path), e.g. `response_format.json_schema.schema.items`. */
  readonly path: string;
  /** The keyword or feature refused, when there is one (`uniqueItems`, `$ref`, `lookahead`). */
  readonly keyword?: string;

  constructor(path: string, message: string, keyword?: string) {
    super(path === "" ? message : `${path}: ${message}`);
    this.name = "GrammarError";
    this.path = path;
    if (keyword !== undefined) this.keyword = keyword;
  }
}
