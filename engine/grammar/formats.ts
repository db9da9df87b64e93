/**
 * String formats constrained during generation, as patterns over the decoded value (they are
 * compiled with the JSON-string encoding of engine/grammar/json_lex.ts `jsonClass`). Each one
 * generates only values that are valid for the format; some valid spellings are never produced
 * (lowercase `t`/`z` in date-time, leap seconds, quoted or IP-literal e-mail addresses).
 */

const YEAR = "\\d{4}";
const LEAP_YEAR = "(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)";
const MONTH_DAY = "((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|" +
  "02-(0[1-9]|1\\d|2[0-8]))";
/** RFC 3339 full-date, calendar-exact (29 February only in leap years). */
const DATE = `(${YEAR}-${MONTH_DAY}|${LEAP_YEAR}-02-29)`;
const HOUR = "([01]\\d|2[0-3])";
/** RFC 3339 full-time: seconds 00–59, optional fraction, an offset (Z or ±hh:mm). */
const TIME = `${HOUR}:[0-5]\\d:[0-5]\\d(\\.\\d+)?(Z|[+-]${HOUR}:[0-5]\\d)`;
const HEX = "[0-9a-fA-F]";
const ATOM = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
const LABEL = "[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?";
const OCTET = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";

/** Supported `format` values and the pattern (anchored, whole value) each one generates. */
export const FORMATS: Record<string, string> = {
  date: DATE,
  time: TIME,
  "date-time": `${DATE}T${TIME}`,
  uuid: `${HEX}{8}-${HEX}{4}-${HEX}{4}-${HEX}{4}-${HEX}{12}`,
  email: `${ATOM}(\\.${ATOM})*@${LABEL}(\\.${LABEL})+`,
  ipv4: `${OCTET}(\\.${OCTET}){3}`,
};
