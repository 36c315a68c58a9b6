#include "runtime/jobs/cases.h"

#include <algorithm>
#include <cctype>

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
std::string document(Rng& rng, int budget, const std::vector<std::string>& facts,
                     const TokenCounter& count) {
    const std::vector<std::string>& pool = filler_sentences();
    int used = 0;
    for (const std::string& f : facts) used += count(f + " ");
    std::vector<std::string> sent;
    for (size_t i = size_t(rng.below(int(pool.size()))); used < budget; ++i) {
        const std::string& s = pool[i % pool.size()];
        sent.push_back(s);
        used += count(s + " ");
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

std::string case_kinds() { return "niah|facts|multihop"; }

void check_case_kinds(const std::vector<std::string>& kinds) {
    IF_CHECK(!kinds.empty(), "sweep.kinds is empty (one or more of " << case_kinds() << ")");
    for (const std::string& k : kinds) {
        IF_CHECK(k == "niah" || k == "facts" || k == "multihop",
                 "sweep.kinds: '" << k << "' is not one of " << case_kinds());
    }
}

QualityCase make_case(const CaseSpec& spec, int index, const TokenCounter& count) {
    check_case_kinds(spec.kinds);
    IF_CHECK(spec.documents >= 2, "sweep.documents must be >= 2, got " << spec.documents);
    IF_CHECK(spec.documents <= int(k_names.size()) / 2,
             "sweep.documents must be <= " << k_names.size() / 2 << ", got " << spec.documents);
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
    return c;
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
