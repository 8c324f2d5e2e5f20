"""The fixed text the tiny tokenizer's BPE merges are trained on.

Built only from literals in this module and a seeded generator of our own, so every machine and Python
version trains the very same merges. It mixes English prose (agent system prompts are mostly English),
JSON (tool schemas and tool calls), code and shell, so long agent prompts compress to ~3-4 chars a token.
"""

from __future__ import annotations

from collections.abc import Iterator

# Common English words, weighted by position: earlier words are drawn more often (a rough Zipf law).
ENGLISH = """
the of and to a in is it you that he was for on are with as I his they be at one have this from or had by
not word but what some we can out other were all there when up use your how said an each she which do their
time if will way about many then them write would like so these her long make thing see him two has look more
day could go come did number sound no most people my over know water than call first who may down side been
now find any new work part take get place made live where after back little only round man year came show
every good me give our under name very through just form sentence great think say help low line differ turn
cause much mean before move right boy old too same tell does set three want air well also play small end put
home read hand port large spell add even land here must big high such follow act why ask men change went
light kind off need house picture try us again animal point mother world near build self earth father head
stand own page should country found answer school grow study still learn plant cover food sun four between
state keep eye never last let thought city tree cross farm hard start might story saw far sea draw left late
run don't while press close night real life few north open seem together next white children begin got walk
example ease paper group always music those both mark often letter until mile river car feet care second book
carry took science eat room friend began idea fish mountain stop once base hear horse cut sure watch color face
wood main enough plain girl usual young ready above ever red list though feel talk bird soon body dog family
direct pose leave song measure door product black short numeral class wind question happen complete ship area
half rock order fire south problem piece told knew pass since top whole king space heard best hour better true
during hundred five remember step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center love person money serve appear
road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine
note wait plan figure star box noun field rest correct able pound done beauty drive stood contain front teach
week final gave green quick develop ocean warm free minute strong special mind behind clear tail produce fact
street inch multiply nothing course stay wheel full force blue object decide surface deep moon island foot
system busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape
equate hot miss brought heat snow tire bring yes distant fill east paint language among grand ball yet wave drop
heart present heavy dance engine position arm wide sail material size vary settle speak weight general ice
matter circle pair include divide syllable felt perhaps pick sudden count square reason length represent art
subject region energy hunt probable bed brother egg ride cell believe fraction forest sit race window store
summer train sleep prove lone leg exercise wall catch mount wish sky board joy winter sat written wild
instrument kept glass grass cow job edge sign visit past soft fun bright gas weather month million bear finish
happy hope flower clothe strange gone jump baby eight village meet root buy raise solve metal whether push seven
paragraph third shall held hair describe cook floor either result burn hill safe cat century consider type law
bit coast copy phrase silent tall sand soil roll temperature finger industry value fight lie beat excite natural
view sense ear else quite broke case middle kill son lake moment scale loud spring observe child straight
consonant nation dictionary milk speed method organ pay age section dress cloud surprise quiet stone tiny climb
cool design poor lot experiment bottom key iron single stick flat twenty skin smile crease hole trade melody trip
office receive row mouth exact symbol die least trouble shout except wrote seed tone join suggest clean break
lady yard rise bad blow oil blood touch grew cent mix team wire cost lost brown wear garden equal sent choose
fell fit flow fair bank collect save control decimal gentle woman captain practice separate difficult doctor
please protect noon whose locate ring character insect caught period indicate radio spoke atom human history
effect electric expect crop modern element hit student corner party supply bone rail imagine provide agree thus
capital won't chair danger fruit rich thick soldier process operate guess necessary sharp wing create neighbor
wash bat rather crowd corn compare poem string bell depend meat rub tube famous dollar stream fear sight thin
triangle planet hurry chief colony clock mine tie enter major fresh search send yellow gun allow print dead spot
desert suit current lift rose continue block chart hat sell success company subtract event particular deal swim
term opposite wife shoe shoulder spread arrange camp invent cotton born determine quart nine truck noise level
chance gather shop stretch throw shine property column molecule select wrong gray repeat require broad prepare
salt nose plural anger claim continent oxygen sugar death pretty skill women season solution magnet silver thank
branch match suffix especially fig afraid huge sister steel discuss forward similar guide experience score apple
bought led pitch coat mass card band rope slip win dream evening condition feed tool total basic smell valley
nor double seat arrive master track parent shore division sheet substance favor connect post spend chord fat
glad original share station dad bread charge proper bar offer segment slave duck instant market degree populate
chick dear enemy reply drink occur support speech nature range steam motion path liquid log meant quotient teeth
shell neck
"""

# More general vocabulary of documentation and instructions.
PROSE = """
able about above accept access according account achieve across action actually add address adjust advance
advantage affect against allow almost alone along already although among amount analysis analyze another
anything anyway apart apply approach approve area argue around article aside aspect assume attach attempt
attention author average aware away background balance become behavior behind belong below benefit beside
best better beyond both brief briefly broken bug bugs calculate capture careful carefully category certain
certainly chapter character choice chosen claim clarify clean clearly closely collection combine comment
comments common commonly compare comparison compatible complex component components concept concern concise
conclude confirm conflict consider consistent constant construct consume contain context continue contrast
contribute convert copy core corresponding count couple cover criteria critical custom data date deal debug
decision deep default define degree deliver demonstrate depend depth derive describe design detail details
detect determine develop developer developers development device differ difference different difficult
direction directly discover discuss display distinct document documentation documents domain double draft
due duplicate dynamic each early easily easy edge effect effective effort either element else elsewhere
enable encounter encourage engineer engineering enough entire equivalent especially essential establish
estimate even eventually every everything evidence exact examine except exchange exclude expand expected
experience experiment explain explore express extend extension external extra fact factor fairly familiar
feature features feedback field figure final finally first fix fixed fixes focus follow following force
frequently full fully further future gain general generally generate generated generic given goal goals
handle happen happens hidden highlight however identify ignore immediately impact improve include included
including increase independent indicate individual information initial inside insight instance intend
intended internal interpret introduce involve issue issues itself keep kind knowledge known large later
latest layer layout lead least length less level library likely limit limited link little locate location
logic longer lower main maintain major make manage manner many mark matter maybe meaning measure mention
merely might minimal minor mode moment more most mostly move much multiple narrow natural nearly need needed
needs neither network normal normally nothing notice obvious obviously occur often once only open operation
operations opinion order ordinary organize other others otherwise outside overall overview own part partial
particular particularly perform performance perhaps period piece place plain point policy portion possible
possibly potential practice precise prefer present prevent previous previously primary principle prior
private probably problem problems procedure produce production program programs proper properly propose
purpose quality quick quite rather reach ready real reason reasonable recent recently recognize record
reduce refer reference regarding regardless related release remain remaining remember report represent
request require requirement requirements research resolve resource resources respect respond rest restore
review rewrite risk robust role root rough routine safe safely same sample scope second section see seem
select selected sense separate sequence serious several shape share short show shown side significant
similar simple simply since situation size skip slightly small solution solve something sometimes soon
sort source space special standard state statement still stop straightforward strategy structure style
subject submit subsequent substantial successful such suggest suitable support sure surface switch table
target technical technique tell term terms than thing things though through thus together top topic toward
track transform treat trigger trust typical typically understand understanding unexpected unless unlike
unnecessary upon user usual usually various verify view visible wait want warn way well what whatever
when where which while whole why wide will wish with without word words work works world worth would yet
yourself
"""

# Vocabulary of software agents: instructions, tools, files, errors, tests.
SOFTWARE = """
file files directory directories folder path paths command commands tool tools user users assistant agent task
tasks code coding function functions method methods class classes module modules package packages repository
repo branch commit commits change changes diff patch edit edits editing read reading write writing search
searching find found grep glob pattern patterns match matches line lines content contents output input inputs
outputs result results error errors warning warnings exception message messages request requests response
responses parameter parameters argument arguments option options default defaults value values string strings
integer number boolean array object objects null true false type types schema property properties required
description name names id identifier return returns call calls called calling invoke execute executed running
run runs test tests testing pass passed fail failed failure build builds install installed dependency
dependencies version versions update updated updates create created delete deleted remove removed rename
replace replaced insert append prefix suffix start end begin finish complete completed pending progress status
todo todos list lists item items entry entries key keys map dictionary set sets index indexes offset limit
range ranges buffer stream streams server client endpoint api http https url urls request header headers body
json yaml toml markdown text plain format formatted formatting syntax parse parsing parser token tokens model
models prompt prompts context system instruction instructions guideline guidelines rule rules important
always never must should avoid prefer use using used usage example examples note notes tip tips step steps
plan planning proactively concise clear explain explanation summary summarize answer question questions
environment variable variables shell bash terminal process processes background foreground timeout seconds
milliseconds minutes permission permissions security secure sensitive secret secrets credential credentials
network web browser fetch download upload local remote absolute relative working current git github pull
push merge rebase status log logs staged unstaged untracked ignore ignored tracked configuration config settings
project projects workspace session sessions conversation history memory cache cached notebook cell cells
python javascript typescript rust go java node npm pip pytest linter lint typecheck compile compiler runtime
import imports export exports define defined definition declaration implementation implement implemented
interface interfaces struct enum trait async await promise callback handler handlers event events listener
loop loops condition conditions branch check checks verify verified validate validation valid invalid
specific specified specify provided provide provides available unavailable exist exists existing missing
empty multiple single unique original modified modify modifying directly instead unless otherwise however
therefore because without within across whenever wherever whether before after during while until ensure
responsible appropriate relevant necessary helpful accurate correct incorrect exactly carefully efficiently
quickly automatically manually explicitly implicitly recommended optional optionally additional additionally
""".split()

KEYWORDS = """
def return if elif else for while in not and or is None True False import from as class self try except
finally raise with yield lambda pass break continue global assert async await print len range str int
float dict list tuple bool open isinstance const let var function return export default interface type
extends implements new this null undefined true false console log require module exports fn pub mut impl
struct enum match use mod crate let Some None Ok Err self super where package main func go defer chan
select public private static void string int boolean
""".split()

JSON_KEYS = """
type function name description parameters properties required items enum default additionalProperties
minimum maximum minItems maxItems format pattern anyOf oneOf allOf $schema title examples object string
integer number boolean array null command file_path path pattern old_string new_string replace_all offset
limit content todos status priority id url prompt query timeout description run_in_background glob output_mode
head_limit multiline notebook_path cell_id new_source edit_mode subagent_type tool_use_id is_error input
arguments role user assistant system tool tool_calls text image source media_type data cache_control
ephemeral thinking signature model max_tokens temperature top_p stop_sequences stream metadata
""".split()

CODE = r'''
def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description="Run the tool.")
    parser.add_argument("--path", type=str, default=".", help="The directory to scan.")
    args = parser.parse_args(argv)
    for root, dirs, files in os.walk(args.path):
        for name in sorted(files):
            if name.endswith(".py"):
                print(os.path.join(root, name))
    return 0


class Config:
    def __init__(self, name: str, value: int = 0) -> None:
        self.name = name
        self.value = value

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "value": self.value}


if __name__ == "__main__":
    raise SystemExit(main())

import { readFile } from "node:fs/promises";
export async function loadJson(path) {
  const text = await readFile(path, "utf8");
  return JSON.parse(text);
}
const result = items.filter((item) => item.enabled).map((item) => item.name);
console.log(`Found ${result.length} items`);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    println!("{:?}", args);
    Ok(())
}

$ git status
$ git diff --stat
$ ls -la src/
$ python -m pytest -q tests/
$ npm install && npm test
$ grep -rn "TODO" --include="*.py" .
$ cd /tmp && mkdir -p build && cd build
$ cat README.md | head -n 20

# Title

## Usage

- Use the `Read` tool to read files.
- Use the `Edit` tool to change files.
- Run tests with `pytest`.

<system-reminder>
The user opened the file in the editor.
</system-reminder>
'''

_SCHEMA_SNIPPETS = [
    '{"type": "object", "properties": {"command": {"type": "string", "description": "The command to execute"}}, '
    '"required": ["command"], "additionalProperties": false}',
    '{"name": "Read", "description": "Reads a file from the local filesystem.", "input_schema": {"type": "object", '
    '"properties": {"file_path": {"type": "string", "description": "The absolute path to the file to read"}, '
    '"offset": {"type": "number"}, "limit": {"type": "number"}}, "required": ["file_path"]}}',
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather.", '
    '"parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}',
    '{"name": "Edit", "arguments": {"file_path": "/repo/src/app.py", "old_string": "x = 1", "new_string": "x = 2"}}',
    '{"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}',
    '{"todos": [{"content": "Run the tests", "status": "pending", "activeForm": "Running the tests"}]}',
]

_PUNCT = [".", ".", ".", ",", ",", ":", ";", "?", "!", " -", ")"]


def _rng(seed: int) -> Iterator[int]:
    """A 64-bit LCG: the same stream on every platform and Python version."""
    state = seed & 0xFFFFFFFFFFFFFFFF
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        yield state >> 33


def _zipf_pick(words: list[str], r: int) -> str:
    # Squaring a uniform draw favours the start of the list.
    u = (r % 1_000_003) / 1_000_003
    return words[int(u * u * len(words))]


def _sentences(words: list[str], rand: Iterator[int], count: int) -> Iterator[str]:
    for _ in range(count):
        n = 4 + next(rand) % 14
        out = []
        for i in range(n):
            w = _zipf_pick(words, next(rand))
            if i == 0:
                w = w[:1].upper() + w[1:]
            out.append(w)
            if i < n - 1 and next(rand) % 9 == 0:
                out[-1] += _PUNCT[next(rand) % 4 + 3]
        yield " ".join(out) + _PUNCT[next(rand) % 3]


def corpus(seed: int = 1234) -> Iterator[str]:
    """Yield the training documents, in a fixed order."""
    rand = _rng(seed)
    english = ENGLISH.split()
    prose = PROSE.split()
    mixed = prose + english + SOFTWARE + SOFTWARE
    for word_list in (english, prose, mixed):
        para: list[str] = []
        for s in _sentences(word_list, rand, 5000):
            para.append(s)
            if len(para) == 5:
                yield ("\n" if next(rand) % 2 else " ").join(para) + "\n\n"
                para = []
    # Each word on its own, capitalised, inflected and at a line start, so every listed word gets merged whole.
    for _ in range(3):
        for w in english + prose + SOFTWARE + KEYWORDS + JSON_KEYS:
            yield f"{w} {w.capitalize()} {w}s {w}ed {w}ing {w}er {w}ly\n{w}. {w}, ({w}) `{w}` \"{w}\": /{w}_{w}-"
    for _ in range(3):
        for snippet in _SCHEMA_SNIPPETS:
            yield snippet + "\n"
        yield CODE
    for _ in range(2000):
        keys = [_zipf_pick(JSON_KEYS, next(rand)) for _ in range(1 + next(rand) % 4)]
        vals = [_zipf_pick(SOFTWARE, next(rand)) for _ in keys]
        body = ", ".join(f'"{k}": "{v}"' for k, v in zip(keys, vals, strict=True))
        yield "{" + body + "}\n"
    for _ in range(1500):
        ws = [_zipf_pick(KEYWORDS, next(rand)) for _ in range(2 + next(rand) % 6)]
        indent = "    " * (next(rand) % 3)
        yield indent + " ".join(ws) + ("(" + _zipf_pick(SOFTWARE, next(rand)) + "):\n")
    for i in range(0, 2000, 7):
        yield f"{i} {i * 13 % 997} {i}.{i % 10} 0x{i:04x} line {i}: 20{i % 30:02d}-0{1 + i % 9}-1{i % 9}\n"
