// The book's search ranking (Sphinx html_search_scorer): Sphinx's default weights, plus a bonus for
// a page whose title holds the query's words. Without it every page with "KV cache" in any heading
// ties at the title weight and the order among them is alphabetical.
var Scorer = {
  score: (result) => {
    const [, title, , , score] = result;
    const words = (new URLSearchParams(window.location.search).get("q") || "")
      .toLowerCase().split(/[^a-z0-9]+/).filter((w) => w.length > 1);
    if (!words.length || !title) return score;
    const page = title.toLowerCase().split(" > ")[0]; // "Page > Section" for a section hit
    const lead = page.split(":")[0]; // the title's lead phrase names the topic
    const share = (text) => words.filter((w) => text.includes(w)).length / words.length;
    const focus = Math.min(1, words.join(" ").length / lead.length); // a lead that is mostly the query
    return score + 20 * share(page) + 10 * share(lead) + 5 * share(lead) * focus;
  },
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
