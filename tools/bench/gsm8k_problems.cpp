// Synthetic grade-school word problems in GSM8K's format (issue 18's training and eval data): 24
// kinds, most of them two to four steps, over wide number ranges; every intermediate value is an
// integer, and every step is written as GSM8K writes it ("a * b = <<a*b=c>>c"), ending "#### N".
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tools/bench/gsm8k.h"

namespace nibble::tools {
namespace {

struct Person {
  const char* name;
  bool she;
};
constexpr Person PEOPLE[] = {{"Natalia", true}, {"James", false}, {"Aisha", true}, {"Mateo", false},
                             {"Priya", true},   {"Liam", false},  {"Sofia", true}, {"Kenji", false},
                             {"Amara", true},   {"Noah", false},  {"Elena", true}, {"Omar", false},
                             {"Mei", true},     {"Lucas", false}, {"Zara", true},  {"Diego", false}};
constexpr const char* ITEMS[] = {"apples", "marbles", "stickers", "pencils", "cookies", "books",
                                 "shells", "cards",   "cupcakes", "stamps",  "beads",   "candles"};

std::string s(int64_t v) { return std::to_string(v); }

// One problem being written: random draws, people, and GSM8K-style annotated steps.
struct Writer {
  std::mt19937_64& rng;
  Person p, q;  // the main person and someone else
  std::string item;

  int64_t pick(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1)); }
  std::string he() const { return p.she ? "she" : "he"; }
  std::string his() const { return p.she ? "her" : "his"; }
  std::string He() const { return p.she ? "She" : "He"; }
  std::string name() const { return p.name; }
  std::string other() const { return q.name; }
  // "a op b = <<a op b=r>>r", for op in + - * /.
  static std::string step(int64_t a, char op, int64_t b, int64_t r, const std::string& unit = "") {
    const std::string e = s(a) + op + s(b);
    return s(a) + " " + op + " " + s(b) + " = " + unit + "<<" + e + "=" + s(r) + ">>" + s(r);
  }
};

using Kind = std::function<Gsm8kItem(Writer&)>;

const std::vector<Kind>& kinds() {
  static const std::vector<Kind> all = {
      [](Writer& w) {  // buy, then give away
        const int64_t a = w.pick(50, 4000), b = w.pick(2, 3000), t = a + b, c = w.pick(1, t), r = t - c;
        return Gsm8kItem{w.name() + " had " + s(a) + " " + w.item + ". " + w.He() + " bought " + s(b) +
                             " more, then gave " + s(c) + " to " + w.other() + ". How many " + w.item + " does " +
                             w.name() + " have now?",
                         "After buying more, " + w.name() + " had " + Writer::step(a, '+', b, t) + " " + w.item +
                             ".\nAfter giving some away, " + w.he() + " has " + Writer::step(t, '-', c, r) + " " +
                             w.item + ".\n#### " + s(r)};
      },
      [](Writer& w) {  // boxes
        const int64_t a = w.pick(12, 250), b = w.pick(2, 99), t = a * b;
        return Gsm8kItem{"A box holds " + s(a) + " " + w.item + ". " + w.name() + " fills " + s(b) +
                             " boxes. How many " + w.item + " are in the boxes altogether?",
                         "The boxes hold " + Writer::step(a, '*', b, t) + " " + w.item + ".\n#### " + s(t)};
      },
      [](Writer& w) {  // hourly wage over days
        const int64_t a = w.pick(8, 95), b = w.pick(2, 12), c = w.pick(2, 60), d = a * b, t = d * c;
        return Gsm8kItem{w.name() + " earns $" + s(a) + " an hour and works " + s(b) + " hours a day. How much does " +
                             w.he() + " earn in " + s(c) + " days?",
                         "In a day " + w.he() + " earns " + Writer::step(a, '*', b, d, "$") + ".\nIn " + s(c) +
                             " days " + w.he() + " earns " + Writer::step(d, '*', c, t, "$") + ".\n#### " + s(t)};
      },
      [](Writer& w) {  // equal shares
        const int64_t b = w.pick(2, 60), each = w.pick(2, 250), a = b * each;
        return Gsm8kItem{w.name() + " has " + s(a) + " " + w.item + " and shares them equally among " + s(b) +
                             " friends. How many " + w.item + " does each friend get?",
                         "Each friend gets " + Writer::step(a, '/', b, each) + " " + w.item + ".\n#### " + s(each)};
      },
      [](Writer& w) {  // twice as many the next day
        const int64_t a = w.pick(5, 3000), m = w.pick(2, 9), b = a * m, t = a + b;
        return Gsm8kItem{w.name() + " read " + s(a) + " pages on Monday and " + s(m) +
                             " times as many on Tuesday. How many pages did " + w.he() + " read in the two days?",
                         "On Tuesday " + w.he() + " read " + Writer::step(a, '*', m, b) + " pages.\nIn total " +
                             w.he() + " read " + Writer::step(a, '+', b, t) + " pages.\n#### " + s(t)};
      },
      [](Writer& w) {  // change from a bill
        const int64_t a = w.pick(2, 95), b = w.pick(1, 12), cost = a * b, bill = (cost / 50 + 1) * 50,
                      change = bill - cost;
        return Gsm8kItem{"A shop sells " + w.item + " for $" + s(a) + " each. " + w.name() + " buys " + s(b) +
                             " and pays with $" + s(bill) + ". How much change does " + w.he() + " get?",
                         "The " + w.item + " cost " + Writer::step(a, '*', b, cost, "$") + ".\nThe change is " +
                             Writer::step(bill, '-', cost, change, "$") + ".\n#### " + s(change)};
      },
      [](Writer& w) {  // percent discount
        const int64_t pct = 5 * w.pick(1, 15), price = 20 * w.pick(1, 150), off = price * pct / 100, pay = price - off;
        return Gsm8kItem{"A jacket costs $" + s(price) + ". " + w.name() + " gets a " + s(pct) +
                             "% discount. How much does " + w.he() + " pay?",
                         "The discount is " + s(price) + " * " + s(pct) + " / 100 = $<<" + s(price) + "*" + s(pct) +
                             "/100=" + s(off) + ">>" + s(off) + ".\n" + w.He() + " pays " +
                             Writer::step(price, '-', off, pay, "$") + ".\n#### " + s(pay)};
      },
      [](Writer& w) {  // fraction of a collection, then more
        const int64_t d = w.pick(2, 12), part = w.pick(3, 300), total = d * part, extra = w.pick(1, 90),
                      r = part + extra;
        return Gsm8kItem{w.name() + " has " + s(total) + " " + w.item + ". " + w.He() + " gives 1/" + s(d) +
                             " of them to " + w.other() + ", who already had " + s(extra) + ". How many " + w.item +
                             " does " + w.other() + " have now?",
                         w.other() + " gets " + Writer::step(total, '/', d, part) + " " + w.item + ".\n" + w.other() +
                             " now has " + Writer::step(part, '+', extra, r) + " " + w.item + ".\n#### " + s(r)};
      },
      [](Writer& w) {  // speed, time, distance over two legs
        const int64_t v1 = w.pick(20, 90), t1 = w.pick(1, 12), v2 = w.pick(20, 90), t2 = w.pick(1, 12);
        const int64_t d1 = v1 * t1, d2 = v2 * t2, d = d1 + d2;
        return Gsm8kItem{w.name() + " drives " + s(t1) + " hours at " + s(v1) + " miles per hour, then " + s(t2) +
                             " hours at " + s(v2) + " miles per hour. How many miles does " + w.he() + " drive in all?",
                         "First " + w.he() + " drives " + Writer::step(v1, '*', t1, d1) + " miles.\nThen " + w.he() +
                             " drives " + Writer::step(v2, '*', t2, d2) + " miles.\nIn all " + w.he() + " drives " +
                             Writer::step(d1, '+', d2, d) + " miles.\n#### " + s(d)};
      },
      [](Writer& w) {  // ages
        const int64_t age = w.pick(4, 40), diff = w.pick(2, 30), other = age + diff, years = w.pick(2, 20),
                      sum_now = age + other, sum_later = sum_now + 2 * years, twice = 2 * years;
        return Gsm8kItem{w.name() + " is " + s(age) + " years old and " + w.other() + " is " + s(diff) +
                             " years older. What will " + "the sum of their ages be in " + s(years) + " years?",
                         w.other() + " is " + Writer::step(age, '+', diff, other) +
                             " years old.\nTheir ages add up to " + Writer::step(age, '+', other, sum_now) +
                             " now.\nIn " + s(years) + " years each is " + s(years) + " older, " +
                             Writer::step(years, '*', 2, twice) + " years in all, so the sum is " +
                             Writer::step(sum_now, '+', twice, sum_later) + ".\n#### " + s(sum_later)};
      },
      [](Writer& w) {  // rectangle: area and fencing
        const int64_t l = w.pick(3, 300), b = w.pick(3, 250), twice_l = 2 * l, twice_b = 2 * b, per = twice_l + twice_b,
                      cost = w.pick(2, 40), total = per * cost;
        return Gsm8kItem{"A garden is " + s(l) + " meters long and " + s(b) + " meters wide. Fencing costs $" +
                             s(cost) + " per meter. How much does it cost to fence the whole garden?",
                         "The two long sides are " + Writer::step(l, '*', 2, twice_l) +
                             " meters and the two short sides " + Writer::step(b, '*', 2, twice_b) +
                             " meters.\nThe fence is " + Writer::step(twice_l, '+', twice_b, per) +
                             " meters long.\nIt costs " + Writer::step(per, '*', cost, total, "$") + ".\n#### " +
                             s(total)};
      },
      [](Writer& w) {  // average
        const int64_t n = w.pick(3, 6), avg = w.pick(40, 95);
        std::vector<int64_t> v(static_cast<size_t>(n), avg);
        for (int64_t i = 0; i + 1 < n; ++i) {  // spread while keeping the sum
          const int64_t d = w.pick(0, 10);
          v[static_cast<size_t>(i)] += d, v[static_cast<size_t>(i + 1)] -= d;
        }
        std::string list, sum_text = s(v[0]);
        int64_t sum = v[0];
        for (size_t i = 0; i < v.size(); ++i) list += (i ? (i + 1 == v.size() ? " and " : ", ") : "") + s(v[i]);
        for (size_t i = 1; i < v.size(); ++i) {
          sum_text = sum_text + "+" + s(v[i]);
          sum += v[i];
        }
        return Gsm8kItem{
            w.name() + " scored " + list + " on " + s(n) + " tests. What is " + w.his() + " average score?",
            "The scores add up to <<" + sum_text + "=" + s(sum) + ">>" + s(sum) + ".\nThe average is " +
                Writer::step(sum, '/', n, avg) + ".\n#### " + s(avg)};
      },
      [](Writer& w) {  // weekly savings toward a goal
        const int64_t have = w.pick(10, 200), per_week = w.pick(5, 150), weeks = w.pick(2, 40), need = per_week * weeks,
                      goal = have + need;
        return Gsm8kItem{w.name() + " wants a bike that costs $" + s(goal) + ". " + w.He() + " has $" + s(have) +
                             " and saves $" + s(per_week) + " a week. How many weeks until " + w.he() + " can buy it?",
                         w.He() + " still needs " + Writer::step(goal, '-', have, need, "$") + ".\nThat takes " +
                             Writer::step(need, '/', per_week, weeks) + " weeks.\n#### " + s(weeks)};
      },
      [](Writer& w) {  // unit conversion: hours and minutes
        const int64_t h = w.pick(1, 9), m = 5 * w.pick(1, 11), hm = h * 60, total = hm + m, days = w.pick(2, 30),
                      all = total * days;
        return Gsm8kItem{w.name() + " practices piano for " + s(h) + " hours and " + s(m) +
                             " minutes every day. How many " + "minutes does " + w.he() + " practice in " + s(days) +
                             " days?",
                         s(h) + " hours are " + Writer::step(h, '*', 60, hm) + " minutes, so each day is " +
                             Writer::step(hm, '+', m, total) + " minutes.\nIn " + s(days) + " days that is " +
                             Writer::step(total, '*', days, all) + " minutes.\n#### " + s(all)};
      },
      [](Writer& w) {  // ratio split
        const int64_t a = w.pick(1, 7), b = w.pick(1, 7), unit = w.pick(2, 150), parts = a + b, total = parts * unit,
                      share = a * unit;
        return Gsm8kItem{w.name() + " and " + w.other() + " share " + s(total) + " " + w.item + " in the ratio " +
                             s(a) + ":" + s(b) + ". How many " + w.item + " does " + w.name() + " get?",
                         "There are " + Writer::step(a, '+', b, parts) + " parts.\nEach part is " +
                             Writer::step(total, '/', parts, unit) + " " + w.item + ".\n" + w.name() + " gets " +
                             Writer::step(a, '*', unit, share) + " " + w.item + ".\n#### " + s(share)};
      },
      [](Writer& w) {  // leftover after packing (remainder)
        const int64_t per = w.pick(3, 12), full = w.pick(2, 150), left = w.pick(1, per - 1), packed = per * full,
                      total = packed + left;
        return Gsm8kItem{w.name() + " packs " + s(total) + " " + w.item + " into bags of " + s(per) + ". How many " +
                             w.item + " are left over after filling as many bags as possible?",
                         s(full) + " bags hold " + Writer::step(full, '*', per, packed) + " " + w.item +
                             ", and one more bag would need more than the rest.\nLeft over: " +
                             Writer::step(total, '-', packed, left) + " " + w.item + ".\n#### " + s(left)};
      },
      [](Writer& w) {  // two prices, several of each
        const int64_t a = w.pick(2, 99), na = w.pick(1, 9), b = w.pick(2, 99), nb = w.pick(1, 9), ca = a * na,
                      cb = b * nb, t = ca + cb;
        return Gsm8kItem{"Notebooks cost $" + s(a) + " and pens cost $" + s(b) + ". " + w.name() + " buys " + s(na) +
                             " notebooks and " + s(nb) + " pens. How much does " + w.he() + " spend?",
                         "The notebooks cost " + Writer::step(a, '*', na, ca, "$") + ".\nThe pens cost " +
                             Writer::step(b, '*', nb, cb, "$") + ".\nTogether " + Writer::step(ca, '+', cb, t, "$") +
                             ".\n#### " + s(t)};
      },
      [](Writer& w) {  // work rate: two machines
        const int64_t r1 = w.pick(5, 60), r2 = w.pick(5, 60), hours = w.pick(2, 40), rate = r1 + r2,
                      total = rate * hours;
        return Gsm8kItem{"One machine makes " + s(r1) + " " + w.item + " an hour and another makes " + s(r2) +
                             ". How many " + w.item + " do both make together in " + s(hours) + " hours?",
                         "Together they make " + Writer::step(r1, '+', r2, rate) + " " + w.item + " an hour.\nIn " +
                             s(hours) + " hours they make " + Writer::step(rate, '*', hours, total) + " " + w.item +
                             ".\n#### " + s(total)};
      },
      [](Writer& w) {  // tax added
        const int64_t price = 10 * w.pick(2, 400), pct = w.pick(2, 12), product = price * pct;
        if (product % 100) return Gsm8kItem{};  // redrawn: keep the cents out
        const int64_t tax = product / 100, total = price + tax;
        return Gsm8kItem{"A bike costs $" + s(price) + " before a " + s(pct) + "% sales tax. How much does " +
                             w.name() + " pay with the tax?",
                         "The tax is " + s(price) + " * " + s(pct) + " / 100 = $<<" + s(price) + "*" + s(pct) +
                             "/100=" + s(tax) + ">>" + s(tax) + ".\n" + w.He() + " pays " +
                             Writer::step(price, '+', tax, total, "$") + ".\n#### " + s(total)};
      },
      [](Writer& w) {  // weekly schedule with weekends
        const int64_t weekday = w.pick(1, 12), weekend = w.pick(1, 20), wd = weekday * 5, we = weekend * 2, t = wd + we;
        return Gsm8kItem{w.name() + " walks " + s(weekday) + " kilometers each weekday and " + s(weekend) +
                             " kilometers each weekend day. How many kilometers does " + w.he() + " walk in a week?",
                         "On weekdays " + w.he() + " walks " + Writer::step(weekday, '*', 5, wd) +
                             " kilometers.\nOn the weekend " + w.he() + " walks " + Writer::step(weekend, '*', 2, we) +
                             " kilometers.\nIn a week " + Writer::step(wd, '+', we, t) + " kilometers.\n#### " + s(t)};
      },
      [](Writer& w) {  // tickets: adults and children
        const int64_t adult = w.pick(8, 40), child = w.pick(2, adult - 1), na = w.pick(1, 6), nc = w.pick(1, 8),
                      ca = adult * na, cc = child * nc, t = ca + cc, bill = (t / 100 + 1) * 100, change = bill - t;
        return Gsm8kItem{"Adult tickets cost $" + s(adult) + " and child tickets $" + s(child) + ". " + w.name() +
                             " buys " + s(na) + " adult and " + s(nc) + " child tickets and pays with $" + s(bill) +
                             ". How much change does " + w.he() + " get?",
                         "Adult tickets cost " + Writer::step(adult, '*', na, ca, "$") + ".\nChild tickets cost " +
                             Writer::step(child, '*', nc, cc, "$") + ".\nThe total is " +
                             Writer::step(ca, '+', cc, t, "$") + ".\nThe change is " +
                             Writer::step(bill, '-', t, change, "$") + ".\n#### " + s(change)};
      },
      [](Writer& w) {  // growth over days
        const int64_t start = w.pick(2, 50), per_day = w.pick(2, 60), days = w.pick(3, 90), grown = per_day * days,
                      height = start + grown;
        return Gsm8kItem{"A plant is " + s(start) + " centimeters tall and grows " + s(per_day) +
                             " centimeters a day. How tall is it after " + s(days) + " days?",
                         "It grows " + Writer::step(per_day, '*', days, grown) + " centimeters.\nIt is then " +
                             Writer::step(start, '+', grown, height) + " centimeters tall.\n#### " + s(height)};
      },
      [](Writer& w) {  // comparing two people's collections
        const int64_t a = w.pick(10, 5000), m = w.pick(2, 6), b = a * m, more = b - a;
        return Gsm8kItem{w.name() + " has " + s(a) + " " + w.item + ". " + w.other() + " has " + s(m) +
                             " times as many. How " + "many more " + w.item + " does " + w.other() + " have than " +
                             w.name() + "?",
                         w.other() + " has " + Writer::step(a, '*', m, b) + " " + w.item + ".\nThat is " +
                             Writer::step(b, '-', a, more) + " more.\n#### " + s(more)};
      },
      [](Writer& w) {  // pages left after reading for days
        const int64_t per_day = w.pick(5, 150), days = w.pick(2, 40), read = per_day * days, left = w.pick(1, 400),
                      total = read + left;
        return Gsm8kItem{"A book has " + s(total) + " pages. " + w.name() + " reads " + s(per_day) +
                             " pages a day for " + s(days) + " days. How many pages are left?",
                         w.He() + " reads " + Writer::step(per_day, '*', days, read) +
                             " pages.\nPages left: " + Writer::step(total, '-', read, left) + ".\n#### " + s(left)};
      },
  };
  return all;
}

}  // namespace

int64_t gsm8k_like_kinds() { return static_cast<int64_t>(kinds().size()); }

std::vector<Gsm8kItem> make_gsm8k_like(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Gsm8kItem> out;
  while (static_cast<int64_t>(out.size()) < n) {
    const size_t who = rng() % std::size(PEOPLE),
                 other = (who + 1 + rng() % (std::size(PEOPLE) - 1)) % std::size(PEOPLE);
    Writer w{rng, PEOPLE[who], PEOPLE[other], ITEMS[rng() % std::size(ITEMS)]};
    Gsm8kItem item = kinds()[rng() % kinds().size()](w);
    if (!item.question.empty()) out.push_back(std::move(item));  // a kind may refuse its draw
  }
  return out;
}

}  // namespace nibble::tools
