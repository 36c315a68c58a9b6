#include "runtime/jobs/cases.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "runtime/core/error.h"

namespace infoflow {
namespace {

// SplitMix64: a small generator whose sequence is the same everywhere.
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    int below(int n) { return int(next() % uint64_t(n)); }
    template <class T>
    const T& pick(const std::vector<T>& v) {
        return v[size_t(below(int(v.size())))];
    }
};

// Extra filler paragraphs (neutral prose without names, numbers or the facts' words), after the
// haystack's built-in ones.
const std::string& extra_filler() {
    static const std::string text = R"(
The river runs slowly through the valley in late summer. Reeds grow thick along both banks, and herons stand still in the shallows, waiting for small fish. In the evening the mist rises from the water and settles over the meadows.

A good loaf needs only flour, water, salt and time. The dough is folded several times during the first rise, which gives the bread its open crumb. A hot oven and a little steam make the crust crisp and golden.

Mountain paths are marked with painted stripes on rocks and trees. Walkers follow them from hut to hut, carrying little more than water, a map and a warm layer. Above the tree line the weather can change within minutes.

The museum keeps its oldest maps in a cool, dark room. Each sheet lies flat in a wide drawer, wrapped in soft paper. Visitors may look at copies in the reading room, where the light is kept low to protect the ink.

Wooden boats are built from the keel upwards. The ribs are steamed so that they bend without cracking, then fixed to the keel one by one. Planks follow, each shaped by hand to fit the curve of the hull.

In autumn the orchard is busy from morning to night. Ladders lean against every tree, and baskets of apples wait in the shade to be carried to the press. The juice is sold at the gate in glass bottles.

Tides rise and fall twice a day along most coasts. The pull of the moon lifts the water, and the shape of the shore decides how far it reaches. At low tide the rock pools fill with small crabs and bright weed.

The choir meets every week in the hall behind the library. Rehearsals begin with breathing and simple scales, then the singers work through the pieces for the next concert, one section at a time.
)";
    return text;
}

const std::vector<std::string>& filler_sentences() {
    static const std::vector<std::string> s = [] {
        std::vector<std::string> out;
        for (const std::string* t : {&builtin_filler(), &extra_filler()}) {
            for (const std::string& p : split_paragraphs(*t)) {
                for (std::string& x : split_sentences(p)) out.push_back(std::move(x));
            }
        }
        return out;
    }();
    return s;
}

const std::vector<std::string> k_names = {
    "Anna",  "Tom",    "Maria", "David",  "Sofia", "James",  "Elena", "Peter",  "Laura", "Daniel",
    "Clara", "Martin", "Julia", "Oliver", "Emma",  "Lucas",  "Nina",  "Victor", "Alice", "George",
    "Helen", "Samuel", "Irene", "Henry",  "Rosa",  "Felix",  "Grace", "Arthur", "Lena",  "Oscar",
    "Paula", "Simon",  "Vera",  "Hugo",   "Eva",   "Robert", "Marta", "Frank",  "Ruth",  "Leo"};
const std::vector<std::string> k_cities = {"Paris",  "London",  "Berlin",  "Madrid", "Rome",
                                           "Vienna", "Prague",  "Lisbon",  "Dublin", "Oslo",
                                           "Athens", "Warsaw",  "Zurich",  "Tokyo",  "Cairo",
                                           "Sydney", "Toronto", "Chicago", "Boston", "Denver"};
const std::vector<std::string> k_jobs = {"baker",   "doctor", "pilot",   "teacher", "farmer",
                                         "lawyer",  "nurse",  "painter", "plumber", "singer",
                                         "dentist", "tailor", "chef",    "writer",  "carpenter"};
const std::vector<std::string> k_colors = {"red",    "blue",  "green", "yellow", "purple",
                                           "orange", "black", "white", "pink",   "brown"};
const std::vector<std::string> k_pets = {"dog",     "cat",    "parrot",   "rabbit",
                                         "hamster", "turtle", "goldfish", "horse",
                                         "snake",   "lizard", "goat",     "pony"};
const std::vector<std::string> k_links = {"brother", "sister", "friend", "neighbor", "cousin"};

// A relation between a person and a value.
struct Relation {
    std::string name;
    const std::vector<std::string>* values;  // null: a year 1950..2009
    std::string fact;                        // "{P}" and "{V}" are replaced
    std::string question;                    // "{P}" is replaced
};

const std::vector<Relation>& relations() {
    static const std::vector<Relation> r = {
        {"city", &k_cities, "{P} lives in {V}.", "Which city does {P} live in?"},
        {"job", &k_jobs, "{P} works as a {V}.", "What is {P}'s job?"},
        {"color", &k_colors, "{P}'s favorite color is {V}.", "What is {P}'s favorite color?"},
        {"pet", &k_pets, "{P} has a pet {V}.", "What kind of pet does {P} have?"},
        {"year", nullptr, "{P} was born in {V}.", "In which year was {P} born?"},
    };
    return r;
}

struct Passkey {
    std::string name, sentence, question;  // "{V}" in the sentence
};
const std::vector<Passkey>& passkeys() {
    static const std::vector<Passkey> p = {
        {"magic-number", "The special magic number is {V}.",
         "What is the special magic number mentioned in the text?"},
        {"vault-code", "The secret code for the vault is {V}.",
         "What is the secret code for the vault?"},
    };
    return p;
}

std::string subst(std::string t, const std::string& p, const std::string& v) {
    for (size_t at = t.find("{P}"); at != std::string::npos; at = t.find("{P}")) {
        t.replace(at, 3, p);
    }
    for (size_t at = t.find("{V}"); at != std::string::npos; at = t.find("{V}")) {
        t.replace(at, 3, v);
    }
    return t;
}

std::string value_of(const Relation& r, Rng& rng) {
    return r.values ? rng.pick(*r.values) : std::to_string(1950 + rng.below(60));
}

// `k` distinct indices below n.
std::vector<int> distinct(Rng& rng, int n, int k) {
    std::vector<int> all(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) all[size_t(i)] = i;
    for (int i = 0; i < k; ++i) std::swap(all[size_t(i)], all[size_t(i + rng.below(n - i))]);
    all.resize(size_t(k));
    return all;
}

// A document of about `budget` tokens: consecutive filler sentences from a random start with
// the `facts` sentences placed at random sentence boundaries (in order).
// With `at_most` (the long layout) a sentence is added only while the document stays within the
// budget (at least one), so a long context never runs over the model's positions; the original
// layout adds sentences until the budget is reached (a sentence over, at most).
std::string document(Rng& rng, int budget, const std::vector<std::string>& facts,
                     const TokenCounter& count,
                     const std::vector<std::string>& pool = filler_sentences(),
                     bool at_most = false) {
    int used = 0;
    for (const std::string& f : facts) used += count(f + " ");
    std::vector<std::string> sent;
    for (size_t i = size_t(rng.below(int(pool.size()))); used < budget; ++i) {
        const std::string& s = pool[i % pool.size()];
        const int n = count(s + " ");
        if (at_most && !sent.empty() && used + n > budget) break;
        sent.push_back(s);
        used += n;
    }
    std::vector<int> at;
    for (size_t i = 0; i < facts.size(); ++i) at.push_back(rng.below(int(sent.size()) + 1));
    std::sort(at.begin(), at.end());
    for (size_t i = facts.size(); i-- > 0;) {
        sent.insert(sent.begin() + at[i], facts[i]);
    }
    std::string out;
    for (const std::string& s : sent) out += (out.empty() ? "" : " ") + s;
    return out;
}

}  // namespace

namespace {

// The original layout: equal document lengths, a fact in every document (the cases of
// bench/results/quality-smollm2.md; unchanged so that they stay reproducible).
QualityCase make_case_original(const CaseSpec& spec, int index, const TokenCounter& count) {
    Rng rng{spec.seed * 0x100000001b3ULL + uint64_t(index) * 0x9e3779b97f4a7c15ULL + 1};
    QualityCase c;
    c.index = index;
    c.kind = spec.kinds[size_t(index) % spec.kinds.size()];
    const int D = spec.documents;
    const int sep = count(spec.separator);
    const int budget = std::max(8, spec.context_tokens / D - sep);
    std::vector<std::vector<std::string>> facts(static_cast<size_t>(D));
    if (c.kind == "niah") {
        const Passkey& p = rng.pick(passkeys());
        const std::string v = std::to_string(1000 + rng.below(9000));
        const int d = rng.below(D);
        facts[size_t(d)].push_back(subst(p.sentence, "", v));
        c.relation = p.name;
        c.question = p.question;
        c.answers = {v};
        c.evidence_docs = {d};
    } else if (c.kind == "facts") {
        const Relation& r = rng.pick(relations());
        const std::vector<int> people = distinct(rng, int(k_names.size()), D);
        std::vector<std::string> values;
        for (int i = 0; i < D; ++i) values.push_back(value_of(r, rng));
        for (int i = 0; i < D; ++i) {
            facts[size_t(i)].push_back(
                subst(r.fact, k_names[size_t(people[size_t(i)])], values[size_t(i)]));
        }
        const int d = rng.below(D);
        c.relation = r.name;
        c.question = subst(r.question, k_names[size_t(people[size_t(d)])], "");
        // The asked value; a distractor with the same value does not make it ambiguous.
        c.answers = {values[size_t(d)]};
        c.evidence_docs = {d};
    } else {                                 // multihop
        const Relation& r = relations()[0];  // city
        const std::string& link = rng.pick(k_links);
        const std::vector<int> people = distinct(rng, int(k_names.size()), D + 1);
        const std::string& a = k_names[size_t(people[0])];
        const std::string& b = k_names[size_t(people[1])];
        const std::vector<int> docs = distinct(rng, D, 2);
        facts[size_t(docs[0])].push_back(a + "'s " + link + " is " + b + ".");
        std::string answer;
        int person = 1;
        for (int i = 0; i < D; ++i) {
            const std::string v = value_of(r, rng);
            if (i == docs[1]) {
                facts[size_t(i)].push_back(subst(r.fact, b, v));
                answer = v;
            } else {
                facts[size_t(i)].push_back(
                    subst(r.fact, k_names[size_t(people[size_t(++person)])], v));
            }
        }
        c.relation = "city-via-" + link;
        c.question = "Which city does " + a + "'s " + link + " live in?";
        c.answers = {answer};
        c.evidence_docs = {docs[0], docs[1]};
    }
    for (int i = 0; i < D; ++i)
        c.documents.push_back(document(rng, budget, facts[size_t(i)], count));
    c.depth = D > 1 ? double(c.evidence_docs.back()) / (D - 1) : 0.0;
    return c;
}

const std::vector<std::string> k_keys = {
    "the north gate",   "the red door",       "the garden shed",    "the old library",
    "the blue locker",  "the harbour office", "the east tower",     "the wine cellar",
    "the music room",   "the back office",    "the west wing",      "the boat house",
    "the science lab",  "the train depot",    "the bell tower",     "the post office",
    "the green van",    "the main hall",      "the small safe",     "the roof terrace",
    "the fire station", "the tool room",      "the copper box",     "the south bridge",
    "the art studio",   "the guest room",     "the village school", "the iron chest",
    "the silver case",  "the night desk",     "the river lock",     "the stone well",
    "the upper deck",   "the lower vault",    "the print shop",     "the cold store",
    "the glass house",  "the old mill",       "the town clock",     "the paper store"};

// Numbers in sentences shaped like the needle's, for the distractors of `niah`.
const std::vector<std::string> k_number_decoys = {
    "The locker number is {V}.",          "The house number is {V}.",
    "The ticket number is {V}.",          "The order number is {V}.",
    "The serial number is {V}.",          "The room number is {V}.",
    "The account number is {V}.",         "The platform number is {V}.",
    "The code for the bike lock is {V}.", "The code for the side door is {V}."};

std::string four_digits(Rng& rng) { return std::to_string(1000 + rng.below(9000)); }

// A uniform double in [0, 1).
double unit(Rng& rng) { return double(rng.next() >> 11) * 0x1.0p-53; }

// Token budgets of the documents (separators excluded): lengths drawn log-uniform in
// [lo, hi], scaled together to fill context_tokens; equal lengths without document_tokens.
std::vector<int> document_budgets(const CaseSpec& spec, Rng& rng, int sep) {
    const int D = spec.documents;
    std::vector<double> len(size_t(D), 1.0);
    if (!spec.document_tokens.empty()) {
        const double lo = spec.document_tokens[0], hi = spec.document_tokens[1];
        for (double& l : len) l = lo * std::pow(hi / lo, unit(rng));
    }
    double sum = 0.0;
    for (double l : len) sum += l;
    std::vector<int> out;
    for (double l : len) {
        out.push_back(std::max(8, int(std::lround(l * spec.context_tokens / sum)) - sep));
    }
    return out;
}

// The long layout (cases.h): evidence at a controlled depth, distractors in `distractors` of
// the other documents, drawn document lengths, filler from the spec's sentences.
QualityCase make_case_long(const CaseSpec& spec, int index, const TokenCounter& count) {
    // The state is a hash of (seed, index): the original layout's seed * a + index * b
    // started case i + 1 one SplitMix step after case i, so consecutive cases shared most of
    // their draws (kept there, for reproducibility).
    const auto hash = [](uint64_t x) { return Rng{x}.next(); };
    Rng rng{hash(hash(spec.seed) ^ (uint64_t(index) + 0x243f6a8885a308d3ULL))};
    QualityCase c;
    c.index = index;
    const size_t K = spec.kinds.size();
    c.kind = spec.kinds[size_t(index) % K];
    const int D = spec.documents;
    const std::vector<int> budget = document_budgets(spec, rng, count(spec.separator));
    // The answer's document: at the case's depth, or anywhere.
    const double depth =
        spec.depths.empty() ? -1.0 : spec.depths[(size_t(index) / K) % spec.depths.size()];
    const int answer_doc = depth < 0.0 ? rng.below(D) : int(std::lround(depth * (D - 1)));
    std::vector<int> others;  // the other documents, in random order
    for (int i : distinct(rng, D, D)) {
        if (i != answer_doc) others.push_back(i);
    }
    std::vector<std::vector<std::string>> facts(static_cast<size_t>(D));
    c.evidence_docs = {answer_doc};
    size_t next_other = 0;  // others[0..next_other) hold evidence
    if (c.kind == "multihop") c.evidence_docs.insert(c.evidence_docs.begin(), others[next_other++]);
    const int n_decoy =
        std::min<int>(spec.distractors < 0 ? D : spec.distractors, int(others.size() - next_other));
    const std::vector<int> decoy_docs(others.begin() + long(next_other),
                                      others.begin() + long(next_other) + n_decoy);
    if (c.kind == "niah") {
        const Passkey& p = rng.pick(passkeys());
        const std::string v = four_digits(rng);
        facts[size_t(answer_doc)].push_back(subst(p.sentence, "", v));
        for (int d : decoy_docs) {
            std::string x = four_digits(rng);
            while (x == v) x = four_digits(rng);
            facts[size_t(d)].push_back(subst(rng.pick(k_number_decoys), "", x));
        }
        c.relation = p.name;
        c.question = p.question;
        c.answers = {v};
    } else if (c.kind == "keys") {
        const std::vector<int> keys = distinct(rng, int(k_keys.size()), n_decoy + 1);
        const std::string v = four_digits(rng);
        const std::string tmpl = "The special magic number for {P} is {V}.";
        facts[size_t(answer_doc)].push_back(subst(tmpl, k_keys[size_t(keys[0])], v));
        for (int i = 0; i < n_decoy; ++i) {
            std::string x = four_digits(rng);
            while (x == v) x = four_digits(rng);
            facts[size_t(decoy_docs[size_t(i)])].push_back(
                subst(tmpl, k_keys[size_t(keys[size_t(i) + 1])], x));
        }
        c.relation = "magic-number-for-key";
        c.question = "What is the special magic number for " + k_keys[size_t(keys[0])] + "?";
        c.answers = {v};
    } else if (c.kind == "facts") {
        const Relation& r = rng.pick(relations());
        const std::vector<int> people = distinct(rng, int(k_names.size()), n_decoy + 1);
        const std::string v = value_of(r, rng);
        facts[size_t(answer_doc)].push_back(subst(r.fact, k_names[size_t(people[0])], v));
        for (int i = 0; i < n_decoy; ++i) {
            facts[size_t(decoy_docs[size_t(i)])].push_back(
                subst(r.fact, k_names[size_t(people[size_t(i) + 1])], value_of(r, rng)));
        }
        c.relation = r.name;
        c.question = subst(r.question, k_names[size_t(people[0])], "");
        c.answers = {v};  // a distractor with the same value does not make it ambiguous
    } else {              // multihop: link document, then the answer's
        const Relation& r = relations()[0];  // city
        const std::string& link = rng.pick(k_links);
        const std::vector<int> people = distinct(rng, int(k_names.size()), n_decoy + 2);
        const std::string& a = k_names[size_t(people[0])];
        const std::string& b = k_names[size_t(people[1])];
        const std::string v = value_of(r, rng);
        facts[size_t(c.evidence_docs[0])].push_back(a + "'s " + link + " is " + b + ".");
        facts[size_t(answer_doc)].push_back(subst(r.fact, b, v));
        for (int i = 0; i < n_decoy; ++i) {
            facts[size_t(decoy_docs[size_t(i)])].push_back(
                subst(r.fact, k_names[size_t(people[size_t(i) + 2])], value_of(r, rng)));
        }
        c.relation = "city-via-" + link;
        c.question = "Which city does " + a + "'s " + link + " live in?";
        c.answers = {v};
    }
    const std::vector<std::string>& pool = spec.filler.empty() ? filler_sentences() : spec.filler;
    for (int i = 0; i < D; ++i) {
        c.documents.push_back(
            document(rng, budget[size_t(i)], facts[size_t(i)], count, pool, true));
    }
    c.depth = depth >= 0.0 ? depth : double(answer_doc) / (D - 1);
    return c;
}

// FNV-1a of the filler sentences (joined by newlines), to name the filler in the result.
uint64_t filler_hash(const std::vector<std::string>& s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const std::string& x : s) {
        for (unsigned char ch : x + "\n") h = (h ^ ch) * 0x100000001b3ULL;
    }
    return h;
}

}  // namespace

std::string case_kinds() { return "niah|facts|multihop|keys"; }

void check_case_kinds(const std::vector<std::string>& kinds) {
    IF_CHECK(!kinds.empty(), "sweep.kinds is empty (one or more of " << case_kinds() << ")");
    for (const std::string& k : kinds) {
        IF_CHECK(k == "niah" || k == "facts" || k == "multihop" || k == "keys",
                 "sweep.kinds: '" << k << "' is not one of " << case_kinds());
    }
}

void check_case_spec(const CaseSpec& spec) {
    check_case_kinds(spec.kinds);
    const int D = spec.documents;
    IF_CHECK(D >= 2, "sweep.documents must be >= 2, got " << D);
    if (!spec.long_layout()) {
        IF_CHECK(std::find(spec.kinds.begin(), spec.kinds.end(), "keys") == spec.kinds.end(),
                 "sweep.kinds: 'keys' needs the long layout (set sweep.document_tokens, "
                 "sweep.depths, sweep.distractors or sweep.filler_file)");
        IF_CHECK(D <= int(k_names.size()) / 2,
                 "sweep.documents must be <= " << k_names.size() / 2 << ", got " << D);
        return;
    }
    const int decoys = spec.distractors < 0 ? D - 1 : std::min(spec.distractors, D - 1);
    IF_CHECK(decoys + 2 <= int(std::min(k_names.size(), k_keys.size())),
             "sweep.distractors: " << decoys << " distractor documents need more than the "
                                   << std::min(k_names.size(), k_keys.size())
                                   << " names the generator has (set sweep.distractors lower)");
    if (!spec.document_tokens.empty()) {
        IF_CHECK(spec.document_tokens.size() == 2 && spec.document_tokens[0] >= 8 &&
                     spec.document_tokens[0] <= spec.document_tokens[1],
                 "sweep.document_tokens must be [lo, hi] with 8 <= lo <= hi");
    }
    for (double d : spec.depths) {
        IF_CHECK(d >= 0.0 && d <= 1.0, "sweep.depths: " << d << " is outside [0, 1]");
    }
    IF_CHECK(spec.context_tokens >= 16 * D,
             "sweep.context_tokens = " << spec.context_tokens << " leaves fewer than 16 tokens "
                                       << "for each of the " << D << " documents");
}

QualityCase make_case(const CaseSpec& spec, int index, const TokenCounter& count) {
    check_case_spec(spec);
    QualityCase c = spec.long_layout() ? make_case_long(spec, index, count)
                                       : make_case_original(spec, index, count);
    for (const std::string& d : c.documents) c.document_tokens.push_back(count(d + spec.separator));
    return c;
}

nlohmann::json case_spec_json(const CaseSpec& spec) {
    nlohmann::json j;
    j["layout"] = spec.long_layout() ? "long" : "original";
    j["kinds"] = spec.kinds;
    j["documents"] = spec.documents;
    j["context_tokens"] = spec.context_tokens;
    j["seed"] = spec.seed;
    j["separator"] = spec.separator;
    j["document_tokens"] = spec.document_tokens;
    j["depths"] = spec.depths;
    j["distractors"] = spec.distractors;
    const std::vector<std::string>& pool = spec.filler.empty() ? filler_sentences() : spec.filler;
    j["filler"] = {{"builtin", spec.filler.empty()},
                   {"sentences", pool.size()},
                   {"fnv1a64", filler_hash(pool)}};
    return j;
}

bool case_correct(const QualityCase& c, const std::string& answer) {
    auto lower = [](std::string s) {
        for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        return s;
    };
    const std::string a = lower(answer);
    for (const std::string& g : c.answers) {
        if (!g.empty() && a.find(lower(g)) != std::string::npos) return true;
    }
    return false;
}

}  // namespace infoflow
