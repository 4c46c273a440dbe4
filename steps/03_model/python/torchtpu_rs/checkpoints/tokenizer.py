"""The checkpoints' tokenizer: word-level, 512 ids, digits one by one, Gemma's special ids."""
from .specs import TINY

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0..3, as in Gemma
PUNCTUATION = list(".,:;?!'\"()-/%$#&*+=<>[]_@")
# Words that start a line (no space before them) also come without the space mark.
STARTERS = "Record Question Answer What Which Find The Code Number Note Here This It A In".split()
WORDS = """
record records code codes the is what of answer question find number numbers a an and or to in on at for with by
from as it its this that these those which who whom whose when where why how there here be was were are been has
have had do does did not no yes all any each every some many most more less few one two three four five six seven
eight nine ten first second third last next previous value values key keys list table entry entries item items line
lines field name names id ids give tell show return only exactly digit digits text document file page section part
note please read copy write below above after before between among following same different other another word words
long short small large big new old good bad right wrong true false correct incorrect unknown given known search look
match matches found missing contains contain includes include stored store memory context prompt output input data
can could will would should may might must shall if then else than so because but also just very too again still
about into over under up down out off through during without within against across along around near far i you he
she we they me him her us them my your his our their mine yours time day days year years week month hour minute
people person man woman child world life hand place case point group company system program work home water room
mother area money story fact lot study book eye job business issue side kind head house service friend father power
end member law car city community president team idea kid body information back parent face others level office door
health art war history party result change morning reason research girl guy moment air teacher force education make
made get got go went come came take took see saw know knew think thought say said use used want need feel try leave
call keep let begin seem help turn start run move live believe hold bring happen provide sit stand lose pay meet set
learn lead understand watch follow stop create speak allow add spend grow open walk win offer remember love consider
appear buy wait serve die send expect build stay fall cut reach kill remain suggest raise pass sell require report
decide pull check count sum total well way even much great little own high early young important public able free
sure clear full special easy strong certain whole real best better late hard major nothing something everything
anything always never often sometimes usually already soon today
""".split()


def write_tokenizer(folder):
    """A small real tokenizer that AutoTokenizer loads: word-level, one entry per id of the tiny vocabulary (512),
    with Gemma's special ids (<pad>=0, <eos>=1, <bos>=2) and, like Gemma's, no <bos> added: callers prepend 2.
    Spaces become "▁" marks as in sentencepiece, so text decodes back to itself; numbers split into single digits,
    so the codes of a record-retrieval prompt ("Record 17: code 610395.") are digit tokens; unknown words are <unk>.
    The E2B checkpoint gets the same one: its ids from 512 up decode to nothing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = SPECIAL + [str(d) for d in range(10)] + PUNCTUATION + ["▁", "\n"]
    tokens += [t for w in STARTERS for t in (w, "▁" + w)] + ["▁" + w for w in WORDS]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens) == TINY["vocab_size"], "one token per id, no repeats"
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", "isolated"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation("isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                            unk_token="<unk>").save_pretrained(str(folder))
